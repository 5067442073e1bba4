"""GGUF's simple block formats (Q4_0, Q4_1, Q8_0) run natively as weight-only int.

A GGUF block is 32 weights of one row with one scale ``d`` (and, for Q4_1, a
minimum ``m``): Q4_0 ``w = d·(q − 8)``, Q4_1 ``w = d·q + m``, Q8_0 ``w = d·q`` with
``q`` signed. Each is exactly the canonical :class:`WeightOnlyInt` with group size 32:
``scale = d`` and ``zero = 8``, ``−m/d`` and ``128`` (``q + 128`` unsigned). So the
loader hands the linear layers unpacked ``q``, per-group scales and zero points
(:func:`glowlm.model_loader.gguf.iterate_tensors`), and the platform's weight-only
kernels stream the 4- or 8-bit values as they do GPTQ's: no dequantize-then-matmul,
~4.5-8.5 bits per weight read at decode instead of 16.

The config is not in the file: :func:`glowlm.model_loader.gguf.native_quant_config`
builds it from the header (which layers are Q4_0/Q4_1/Q8_0 in every fused part), and
the engine uses it only where the platform implements ``gguf``; elsewhere, and for the
K-quants and Q5 types, tensors are dequantized at load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from glowlm.errors import ModelLoadError
from glowlm.layers.linear import LinearMethod
from glowlm.layers.quantization import QuantizationConfig
from glowlm.layers.quantization.kernels import QuantKernels, WeightOnlyInt
from glowlm.layers.quantization.method import QuantLinearMethod, add_param, check_divisible

GROUP = 32
#: GGUF tensor types this format runs natively, and their bits in the kernel.
NATIVE_TYPES = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}


class GGUFConfig(QuantizationConfig):
    """``{"quant_method": "gguf", "layers": {prefix: bits}}``: the natively run layers."""

    name = "gguf"

    def __init__(self, layers: dict[str, int]) -> None:
        super().__init__()
        self.layers = layers

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GGUFConfig:
        layers = config.get("layers")
        if not isinstance(layers, dict) or any(b not in (4, 8) for b in layers.values()):
            raise ModelLoadError("gguf quantization_config needs 'layers': {prefix: 4 or 8}")
        return cls({str(k): int(v) for k, v in layers.items()})

    def linear_method(self, prefix: str) -> LinearMethod | None:
        bits = self.layers.get(prefix)
        return None if bits is None else GGUFLinearMethod(bits, self.kernels())


class GGUFLinearMethod(QuantLinearMethod):
    """Parameters as the GGUF loader yields them: ``gguf_q`` (uint8 values, one per
    weight), ``gguf_scales`` and ``gguf_zeros`` (float32, one per 32-weight block)."""

    param_names = ("gguf_q", "gguf_scales", "gguf_zeros")

    def __init__(self, bits: int, kernels: QuantKernels) -> None:
        super().__init__(kernels)
        self.bits = bits

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: Sequence[int], params_dtype: torch.dtype
                       ) -> None:
        check_divisible(input_size, GROUP, "input size", getattr(layer, "prefix", "?"))
        n = sum(output_partition_sizes)
        add_param(layer, "gguf_q", (n, input_size), torch.uint8, output_dim=0, input_dim=1)
        for name in ("gguf_scales", "gguf_zeros"):
            add_param(layer, name, (n, input_size // GROUP), torch.float32, output_dim=0,
                      input_dim=1)

    def canonical(self, layer: nn.Module) -> WeightOnlyInt:
        return WeightOnlyInt(layer.gguf_q.data.contiguous(), layer.gguf_scales.data.contiguous(),
                             layer.gguf_zeros.data.contiguous(), self.bits, GROUP)


def split_blocks(data: Any, type_name: str, shape: tuple[int, ...]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One GGUF tensor of a native type -> (q uint8 [N, K], scales, zeros float32 [N, K/32]).

    ``dequantize(q, scales, zeros) == gguf dequantize(data)`` exactly: a Q4_1 block whose
    scale is 0 holds one value, ``m``, and becomes ``scale 1, q 0, zero −m``.
    """
    from glowlm.model_loader.gguf import BLOCK_TYPES, block_fields

    if type_name not in BLOCK_TYPES:
        raise ModelLoadError(f"GGUF type {type_name} is not run natively")
    n, k = shape
    d, m, q = block_fields(data, type_name)
    if type_name == "Q8_0":
        q = (q.to(torch.int16) + 128).to(torch.uint8)
        zeros = torch.full_like(d, 128.0)
    elif m is None:  # Q4_0
        zeros = torch.full_like(d, 8.0)
    else:  # Q4_1
        flat = d == 0
        if bool(flat.any()):
            q = torch.where(flat, torch.zeros_like(q), q)
            d = torch.where(flat, torch.ones_like(d), d)
        zeros = -m / d
    return (q.reshape(n, k).contiguous(), d.reshape(n, k // GROUP).contiguous(),
            zeros.reshape(n, k // GROUP).contiguous())
