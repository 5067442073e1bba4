"""The hook implementations glowlm finds through the ``glowlm.plugins`` entry point."""

from __future__ import annotations

from glowlm.platforms.interface import Platform
from glowlm.plugins.hookspecs import hookimpl

from glowlm_zen.platform import ZenPlatform


@hookimpl
def glowlm_platforms() -> list[type[Platform]]:
    return [ZenPlatform]
