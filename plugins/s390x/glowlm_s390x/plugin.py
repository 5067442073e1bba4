"""The hook implementations glowlm finds through the ``glowlm.plugins`` entry point."""

from __future__ import annotations

from glowlm.platforms.interface import Platform
from glowlm.plugins.hookspecs import hookimpl

from glowlm_s390x.platform import S390xPlatform


@hookimpl
def glowlm_platforms() -> list[type[Platform]]:
    return [S390xPlatform]


@hookimpl
def glowlm_quantization_configs() -> list[type]:
    from glowlm_s390x.quant import quantization_configs

    return quantization_configs()
