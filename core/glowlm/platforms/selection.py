"""Rank every platform the plugins provide and pick one, with reasons.

The rules: a forced platform (``--platform`` / ``GLOWLM_PLATFORM``) wins if it
can run here and is an error naming the reason otherwise; without one, the
matching platform of highest rank wins (Zen 200 > x86 100 > generic 0), and two
matches of equal top rank are an error. Every candidate keeps the reason it
matched or missed, so ``glowlm platforms`` can explain the choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from glowlm.errors import PlatformError
from glowlm.logger import init_logger
from glowlm.platforms.host import HostInfo
from glowlm.platforms.interface import Capabilities, Match, Platform
from glowlm.plugins.manager import LoadedPlugin, PluginSet, load_plugins

logger = init_logger(__name__)


@dataclass
class Candidate:
    """One platform class seen during selection, or one plugin that failed to give any."""

    name: str
    plugin: str
    distribution: str
    version: str
    rank: int
    matched: bool
    reason: str
    cls: type[Platform] | None = None
    isa: str | None = None
    capabilities: Capabilities | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name, "plugin": self.plugin, "distribution": self.distribution,
            "version": self.version, "matched": self.matched, "rank": self.rank,
            "reason": self.reason,
        }
        if self.capabilities is not None:
            out.update(self.capabilities.to_json())
        return out


@dataclass
class Selection:
    platform: Platform
    reason: str
    candidates: list[Candidate] = field(default_factory=list)
    host: HostInfo | None = None

    def to_json(self) -> dict[str, object]:
        caps = self.platform.capabilities.to_json()
        return {
            "selected": {"name": self.platform.name, "isa": caps["isa"], "dtypes": caps["dtypes"],
                         "quantization": caps["quantization"], "kernels": caps["kernels"],
                         "status": caps["status"], "reason": self.reason},
            "candidates": [c.to_json() for c in self.candidates],
        }


def _validate(plugin: LoadedPlugin, obj: object) -> list[type[Platform]]:
    items = obj if isinstance(obj, list | tuple) else [obj]
    good: list[type[Platform]] = []
    for item in items:
        if not (isinstance(item, type) and issubclass(item, Platform)):
            plugin.error = (f"glowlm_platforms returned {item!r}, which is not a Platform "
                            f"subclass")
            logger.warning("plugin %r: %s", plugin.name, plugin.error)
        elif not item.name or item.name != item.name.lower():
            plugin.error = f"platform class {item.__qualname__} has no lower-case name"
            logger.warning("plugin %r: %s", plugin.name, plugin.error)
        else:
            good.append(item)
    return good


def gather_candidates(plugins: PluginSet, host: HostInfo) -> list[Candidate]:
    """Detect every platform of every plugin against ``host``, best rank first."""
    candidates: list[Candidate] = []
    for plugin, result in plugins.hook_results("glowlm_platforms"):
        for cls in _validate(plugin, result):
            try:
                match = cls.detect(host)
            except Exception as exc:  # noqa: BLE001 - reported, naming the plugin
                match = Match(False, f"detector raised {type(exc).__name__}: {exc}")
                logger.warning("plugin %r: platform %r %s", plugin.name, cls.name, match.reason)
            caps = None
            try:
                caps = cls.capabilities_for(host, match) if match.matched else None
            except Exception as exc:  # noqa: BLE001
                match = Match(False, f"capabilities failed: {type(exc).__name__}: {exc}")
                logger.warning("plugin %r: platform %r %s", plugin.name, cls.name, match.reason)
            candidates.append(Candidate(
                name=cls.name, plugin=plugin.name, distribution=plugin.distribution,
                version=plugin.version, rank=cls.rank, matched=match.matched,
                reason=match.reason, cls=cls, isa=match.isa, capabilities=caps,
            ))
    for plugin in plugins.plugins:  # plugins that gave nothing still get a line
        if plugin.blocked or (plugin.error and not any(c.plugin == plugin.name
                                                        for c in candidates)):
            candidates.append(Candidate(
                name=plugin.name, plugin=plugin.name, distribution=plugin.distribution,
                version=plugin.version, rank=-1, matched=False,
                reason="blocked by GLOWLM_PLUGINS_BLOCK" if plugin.blocked
                else f"plugin failed: {plugin.error}",
            ))
    candidates.sort(key=lambda c: (-c.rank, c.name))
    return candidates


def choose(candidates: list[Candidate], host: HostInfo, forced: str | None = None
           ) -> Selection:
    """Apply the selection rules to detected candidates."""
    by_name = {c.name: c for c in candidates if c.cls is not None}
    if forced:
        cand = by_name.get(forced)
        if cand is None:
            blocked = next((c for c in candidates if c.name == forced), None)
            why = f" ({blocked.reason})" if blocked else ""
            raise PlatformError(
                f"platform {forced!r} is not available{why}; available: "
                f"{', '.join(sorted(by_name)) or 'none'}"
            )
        if not cand.matched:
            raise PlatformError(f"platform {forced!r} cannot run here: {cand.reason}")
        assert cand.cls is not None
        platform = cand.cls(host, Match(True, cand.reason, cand.isa))
        return Selection(platform, f"forced by the user; {cand.reason}", candidates, host)
    matched = [c for c in candidates if c.matched and c.cls is not None]
    if not matched:
        raise PlatformError(
            "no platform can run on this host: "
            + "; ".join(f"{c.name}: {c.reason}" for c in candidates)
        )
    top = matched[0]
    ties = [c for c in matched if c.rank == top.rank]
    if len(ties) > 1:
        raise PlatformError(
            f"platforms {', '.join(repr(c.name) for c in ties)} all match with rank {top.rank}; "
            "force one with --platform NAME or block the others with GLOWLM_PLUGINS_BLOCK"
        )
    assert top.cls is not None
    platform = top.cls(host, Match(True, top.reason, top.isa))
    others = [c for c in matched[1:]]
    reason = top.reason
    if others:
        reason += f" (ranks above {', '.join(c.name for c in others)})"
    return Selection(platform, reason, candidates, host)


def select_platform(
    host: HostInfo,
    forced: str | None = None,
    block: frozenset[str] = frozenset(),
) -> Selection:
    """Load plugins (except blocked ones), detect, and choose."""
    plugins = load_plugins(block)
    return choose(gather_candidates(plugins, host), host, forced)
