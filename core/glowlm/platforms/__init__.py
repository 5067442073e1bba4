"""Platforms: the host description, the interface, and the process's current choice."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from glowlm.platforms.host import HostInfo
from glowlm.platforms.interface import Capabilities, Match, Platform
from glowlm.platforms.selection import Selection, select_platform

_CURRENT: Selection | None = None


def current_selection(forced: str | None = None) -> Selection:
    """The platform for this process, resolved on first use and then kept.

    ``forced`` (the CLI's ``--platform``) takes precedence over ``GLOWLM_PLATFORM``.
    """
    global _CURRENT
    from glowlm import envs
    from glowlm.platforms import host as host_mod

    env = envs.get()
    want = forced or env.platform
    if _CURRENT is None or (want and _CURRENT.platform.name != want):
        _CURRENT = select_platform(host_mod.live(), want, env.plugins_block)
    return _CURRENT


def current_platform(forced: str | None = None) -> Platform:
    return current_selection(forced).platform


@contextlib.contextmanager
def use_platform(platform: Platform, reason: str = "pinned by use_platform"
                 ) -> Iterator[Platform]:
    """Make ``platform`` (an instance) this process's platform inside the block.

    For tests, the contract suite (:mod:`glowlm.testing.contract`) and tools that
    build a platform for a recorded host: engines built in the block (``LLM(...,
    platform=platform.name)`` or with no platform requested) use it. The previous
    choice is restored afterwards.
    """
    global _CURRENT
    saved = _CURRENT
    _CURRENT = Selection(platform, reason, [], platform.host)
    try:
        yield platform
    finally:
        _CURRENT = saved


def reset_current_platform() -> None:
    """Forget the cached choice (tests, or after changing GLOWLM_PLATFORM)."""
    global _CURRENT
    _CURRENT = None


__all__ = ["Capabilities", "HostInfo", "Match", "Platform", "Selection", "current_platform",
           "current_selection", "reset_current_platform", "select_platform", "use_platform"]
