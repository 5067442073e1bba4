"""The hook implementations glowlm finds through the ``glowlm.plugins`` entry point."""

from __future__ import annotations

from glowlm.plugin_api import Platform, hookimpl

from glowlm_s390x.platform import S390xPlatform

#: The glowlm plugin API this plugin is built for (checked at discovery).
GLOWLM_PLUGIN_API = "1.1"


@hookimpl
def glowlm_platforms() -> list[type[Platform]]:
    return [S390xPlatform]


@hookimpl
def glowlm_quantization_configs() -> list[type]:
    from glowlm_s390x.quant import quantization_configs

    return quantization_configs()
