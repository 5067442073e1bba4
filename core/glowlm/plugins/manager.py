"""Find plugins through one entry-point group and register them with pluggy.

Every plugin, core's own ``generic`` platform included, arrives the same way:
an entry point in :data:`ENTRY_POINT_GROUP` naming a module of hook
implementations. A blocked plugin is never imported. A plugin that fails to
import or to register is kept in the result with its error, logged as a
warning naming it, and shown by ``glowlm platforms``; it is never silent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType

import pluggy

from glowlm.logger import init_logger
from glowlm.plugins import hookspecs

logger = init_logger(__name__)

ENTRY_POINT_GROUP = "glowlm.plugins"


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
        try:
            pm.register(module, name=ep.name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            plugin.error = f"invalid hooks: {exc}"
            logger.warning("plugin %r (%s) has %s", ep.name, plugin.distribution, plugin.error)
            continue
        plugin.module = module
    return result
