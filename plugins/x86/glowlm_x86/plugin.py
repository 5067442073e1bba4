"""The hook implementations glowlm finds through the ``glowlm.plugins`` entry point.

Kept separate from :mod:`glowlm_x86.platform` so that importing the plugin stays
cheap and other plugins (Zen) can import the platform class without registering
this plugin's hooks twice.
"""

from __future__ import annotations

from glowlm.plugin_api import Platform, Setting, hookimpl

from glowlm_x86.platform import X86Platform
from glowlm_x86.settings import SETTINGS

#: The glowlm plugin API this plugin is built for (checked at discovery).
GLOWLM_PLUGIN_API = "1.1"


@hookimpl
def glowlm_platforms() -> list[type[Platform]]:
    return [X86Platform]


@hookimpl
def glowlm_quantization_configs() -> list[type]:
    from glowlm_x86.quant import quantization_configs

    return quantization_configs()


@hookimpl
def glowlm_settings() -> list[Setting]:
    return list(SETTINGS)
