"""The hook implementations glowlm finds through the ``glowlm.plugins`` entry point."""

from __future__ import annotations

from glowlm.plugin_api import Platform, hookimpl

from glowlm_apple.platform import ApplePlatform

#: The glowlm plugin API this plugin is built for (checked at discovery).
GLOWLM_PLUGIN_API = "1.1"


@hookimpl
def glowlm_platforms() -> list[type[Platform]]:
    return [ApplePlatform]
