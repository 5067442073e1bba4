"""The quantized linear methods on Arm: core's formats on the shared tree's kernels.

The Arm modules are built from the same kernel tree as x86's, ``quant_*.cpp``
included; on ``neon-bf16`` (FEAT_BF16) the 4-bit weight-only kernel with bf16
activations uses BFDOT, the pairwise bf16 dot product, like vdpbf16ps on x86. They pass
the same contract cases as x86's under qemu (``make test-cross``). AWQ, GPTQ,
compressed-tensors and GGUF checkpoints run on them through
:class:`glowlm_kernels.quant.CompiledQuantKernels` when the module loaded, on core's
pure-PyTorch reference otherwise.
"""

from __future__ import annotations

from glowlm.plugin_api import REFERENCE_QUANT_KERNELS as REFERENCE_KERNELS
from glowlm.plugin_api import Platform, QuantizationConfig, QuantKernels
from glowlm.plugin_api import quantization_for_platform as for_platform
from glowlm_kernels.quant import CompiledQuantKernels, quant_ops_registered, register_fakes

from glowlm_arm.platform import ArmPlatform


def _kernels_for(platform: Platform) -> QuantKernels:
    compiled = platform.compiled() if isinstance(platform, ArmPlatform) else None
    if compiled is None or not quant_ops_registered(compiled.namespace):
        return REFERENCE_KERNELS
    register_fakes(compiled.namespace)
    return CompiledQuantKernels(compiled.namespace, "arm")


def quantization_configs() -> list[type[QuantizationConfig]]:
    return for_platform(ArmPlatform, _kernels_for)
