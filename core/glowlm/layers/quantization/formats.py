"""The checkpoint formats core parses, and how a plugin registers them for its platform."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from glowlm.layers.quantization import QuantizationConfig
from glowlm.layers.quantization.awq import AWQConfig
from glowlm.layers.quantization.compressed_tensors import CompressedTensorsConfig
from glowlm.layers.quantization.gguf import GGUFConfig
from glowlm.layers.quantization.gptq import GPTQConfig

if TYPE_CHECKING:
    from glowlm.layers.quantization.kernels import QuantKernels
    from glowlm.platforms.interface import Platform

FORMAT_CONFIGS: tuple[type[QuantizationConfig], ...] = (AWQConfig, GPTQConfig,
                                                         CompressedTensorsConfig, GGUFConfig)


def for_platform(platform_cls: type[Platform], kernels: Callable[[Platform], QuantKernels]
                 ) -> list[type[QuantizationConfig]]:
    """Every format's config, serving ``platform_cls`` (and its subclasses) with ``kernels``.

    What a plugin's ``glowlm_quantization_configs`` hook returns: the parsing and the
    weight declarations are core's; ``kernels(platform)`` gives the matmuls (a plugin's
    compiled ones, or core's reference when its kernels did not load).
    """

    def supports(cls: type[QuantizationConfig], platform: Platform) -> bool:
        return isinstance(platform, platform_cls)

    def get_kernels(self: QuantizationConfig) -> QuantKernels:
        assert self.platform is not None, "resolve() binds the platform"
        return kernels(self.platform)

    return [type(f"{platform_cls.__name__}{base.__name__}", (base,),
                 {"supports": classmethod(supports), "kernels": get_kernels,
                  "__doc__": f"{base.__name__} on the {platform_cls.name} platform."})
            for base in FORMAT_CONFIGS]
