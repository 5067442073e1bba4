"""The quantized linear methods on IBM Z: core's formats with core's reference matmuls.

The shared kernel tree compiles ``quant_linear.cpp`` into the s390x module too, but
those ops are not called here yet (they are not tested under emulation), so AWQ, GPTQ,
compressed-tensors and GGUF checkpoints run through core's pure-PyTorch reference
(:mod:`glowlm.layers.quantization.kernels`): correct, slow.
"""

from __future__ import annotations

from glowlm.plugin_api import REFERENCE_QUANT_KERNELS as REFERENCE_KERNELS
from glowlm.plugin_api import QuantizationConfig
from glowlm.plugin_api import quantization_for_platform as for_platform

from glowlm_s390x.platform import S390xPlatform


def quantization_configs() -> list[type[QuantizationConfig]]:
    return for_platform(S390xPlatform, lambda platform: REFERENCE_KERNELS)
