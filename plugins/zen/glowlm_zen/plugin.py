"""The hook implementations glowlm finds through the ``glowlm.plugins`` entry point."""

from __future__ import annotations

from glowlm.plugin_api import Platform, Setting, hookimpl

from glowlm_zen.platform import WEIGHT_PREPACK, ZenPlatform

#: The glowlm plugin API this plugin is built for (checked at discovery).
GLOWLM_PLUGIN_API = "1.1"


@hookimpl
def glowlm_platforms() -> list[type[Platform]]:
    return [ZenPlatform]


@hookimpl
def glowlm_settings() -> list[Setting]:
    return [WEIGHT_PREPACK]
