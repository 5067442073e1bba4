"""The hook implementations glowlm finds through the ``glowlm.plugins`` entry point."""

from __future__ import annotations

from glowlm.plugin_api import Platform, hookimpl

from glowlm_arm.platform import ArmPlatform

#: The glowlm plugin API this plugin is built for (checked at discovery).
GLOWLM_PLUGIN_API = "1.1"


@hookimpl
def glowlm_platforms() -> list[type[Platform]]:
    return [ArmPlatform]


@hookimpl
def glowlm_quantization_configs() -> list[type]:
    from glowlm_arm.quant import quantization_configs

    return quantization_configs()
