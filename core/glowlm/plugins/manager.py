"""Find plugins through one entry-point group and register them with pluggy.

Every plugin, core's own ``generic`` platform included, arrives the same way:
an entry point in :data:`ENTRY_POINT_GROUP` naming a module of hook
implementations. A blocked plugin is never imported. A plugin that fails to
import or to register is kept in the result with its error, logged as a
warning naming it, and shown by ``glowlm platforms``; it is never silent.

Registration checks, in order: the plugin API version the module declares
(``GLOWLM_PLUGIN_API``) against :data:`~glowlm.plugins.hookspecs.PLUGIN_API_VERSION`;
pluggy's signature validation; and that every ``glowlm_*`` function in the module is
a known hook decorated with ``@hookimpl`` (pluggy alone would accept a misspelled
hook, or ignore an undecorated one, and the plugin would silently provide nothing).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import TYPE_CHECKING

import pluggy

from glowlm.logger import init_logger
from glowlm.plugins import hookspecs

if TYPE_CHECKING:
    from glowlm.envs import Setting

logger = init_logger(__name__)

ENTRY_POINT_GROUP = "glowlm.plugins"

#: A plugin module that declares no ``GLOWLM_PLUGIN_API`` is refused.
REQUIRE_API_DECLARATION = True


@dataclass
class LoadedPlugin:
    """One entry point and what became of it."""

    name: str
    distribution: str
    version: str
    module: ModuleType | None = None
    blocked: bool = False
    error: str | None = None


@dataclass
class PluginSet:
    manager: pluggy.PluginManager
    plugins: list[LoadedPlugin] = field(default_factory=list)

    def by_name(self, name: str) -> LoadedPlugin | None:
        return next((p for p in self.plugins if p.name == name), None)

    def hook_results(self, hook: str) -> list[tuple[LoadedPlugin, object]]:
        """Call ``hook`` on each loaded plugin separately, pairing results with plugins.

        Called per plugin (not through pluggy's fan-out) so an exception or a bad
        return value is attributed to the plugin that produced it.
        """
        out: list[tuple[LoadedPlugin, object]] = []
        for impl in reversed(getattr(self.manager.hook, hook).get_hookimpls()):
            plugin = self.by_name(impl.plugin_name)
            assert plugin is not None  # registered under its entry-point name
            try:
                out.append((plugin, impl.function()))
            except Exception as exc:  # noqa: BLE001 - reported, naming the plugin
                plugin.error = f"hook {hook} raised {type(exc).__name__}: {exc}"
                logger.warning("plugin %r: %s", plugin.name, plugin.error)
        return out

    def settings(self) -> list[tuple[str, Setting]]:
        """``(owner, setting)`` for core's variables and every loaded plugin's.

        A plugin whose hook returns something that is not a :class:`Setting`, a name
        without the ``GLOWLM_`` prefix, or a name another owner declares gets an
        error naming it (shown by ``glowlm platforms``); its valid settings are kept.
        """
        from glowlm.envs import DOCUMENTED, Setting

        out: list[tuple[str, Setting]] = [
            ("glowlm", Setting(name, default, meaning, lambda _n, raw: raw))
            for name, (default, meaning) in DOCUMENTED.items()]
        owners = {s.name: owner for owner, s in out}
        results = sorted(self.hook_results("glowlm_settings"), key=lambda r: r[0].name)
        for plugin, result in results:  # by name, so the first claimant is stable
            for item in result if isinstance(result, list | tuple) else [result]:
                problem = None
                if not isinstance(item, Setting):
                    problem = f"glowlm_settings returned {item!r}, not a glowlm Setting"
                elif not item.name.startswith("GLOWLM_"):
                    problem = f"setting {item.name!r} does not start with GLOWLM_"
                elif item.name in owners:
                    problem = (f"setting {item.name} is declared by both "
                               f"{owners[item.name]!r} and {plugin.name!r}")
                if problem:
                    plugin.error = problem
                    logger.warning("plugin %r: %s", plugin.name, problem)
                    continue
                owners[item.name] = plugin.name
                out.append((plugin.name, item))
        return out


def api_problem(declared: object, provided: str = hookspecs.PLUGIN_API_VERSION
                ) -> str | None:
    """Why a plugin built for API ``declared`` cannot run on ``provided`` (None: it can)."""
    if declared is None:
        return (f"declares no plugin API version (set {hookspecs.API_ATTRIBUTE} = "
                f"\"{provided}\" in its entry-point module once it is built against "
                f"this API)") if REQUIRE_API_DECLARATION else None
    try:
        major, minor = (int(p) for p in str(declared).split("."))
        have_major, have_minor = (int(p) for p in provided.split("."))
    except ValueError:
        return f"declares plugin API {declared!r}, which is not MAJOR.MINOR"
    if major != have_major or minor > have_minor:
        return (f"was built for glowlm plugin API {declared}, but this glowlm provides "
                f"{provided}: install a release of the plugin built for API "
                f"{have_major}.x, or a glowlm that provides {declared}")
    return None


def hook_problems(pm: pluggy.PluginManager, module: ModuleType) -> list[str]:
    """Misspelled or undecorated ``glowlm_*`` hook functions in a registered module."""
    specs = sorted(n for n in dir(hookspecs) if n.startswith("glowlm_"))
    impls = {hc.name for hc in pm.get_hookcallers(module) or []}
    problems = []
    for name in sorted(n for n in dir(module) if n.startswith("glowlm_")):
        if not callable(getattr(module, name)):
            continue
        if name in specs and name not in impls:
            problems.append(f"{name} is not decorated with @hookimpl, so glowlm never calls "
                            "it")
        elif name not in specs:
            near = difflib.get_close_matches(name, specs, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            problems.append(f"unknown hook {name}{hint}; hooks: {', '.join(specs)}")
    return problems


def _entry_points() -> list[metadata.EntryPoint]:
    eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    seen: dict[str, metadata.EntryPoint] = {}
    for ep in eps:  # the same distribution can be visible twice (editable + site)
        seen.setdefault(ep.name, ep)
    return sorted(seen.values(), key=lambda e: e.name)


def load_plugins(block: frozenset[str] = frozenset()) -> PluginSet:
    """Import every non-blocked plugin and register its hooks with pluggy."""
    pm = pluggy.PluginManager("glowlm")
    pm.add_hookspecs(hookspecs)
    result = PluginSet(pm)
    for ep in _entry_points():
        dist = ep.dist
        plugin = LoadedPlugin(
            name=ep.name,
            distribution=dist.name if dist else "?",
            version=dist.version if dist else "?",
        )
        result.plugins.append(plugin)
        if ep.name.lower() in block:
            plugin.blocked = True
            continue
        try:
            module = ep.load()
        except Exception as exc:  # noqa: BLE001 - reported, naming the plugin
            plugin.error = f"import failed: {type(exc).__name__}: {exc}"
            logger.warning("plugin %r (%s) %s", ep.name, plugin.distribution, plugin.error)
            continue
        problem = api_problem(getattr(module, hookspecs.API_ATTRIBUTE, None))
        if problem:
            plugin.error = problem
            logger.warning("plugin %r (%s %s) %s", ep.name, plugin.distribution,
                           plugin.version, problem)
            continue
        try:
            pm.register(module, name=ep.name)
            problems = hook_problems(pm, module)
            if problems:
                pm.unregister(module)
                raise ValueError("; ".join(problems))
        except (pluggy.PluginValidationError, ValueError) as exc:
            plugin.error = f"invalid hooks: {exc}"
            logger.warning("plugin %r (%s) has %s", ep.name, plugin.distribution, plugin.error)
            continue
        plugin.module = module
    pm.check_pending()  # a catch-all: every registered hook implementation has a spec
    return result
