"""GPTQ checkpoints (``quant_method: gptq``): AutoGPTQ / GPTQModel's classic layout.

Per linear layer (``K`` inputs, ``N`` outputs, ``G = K / group_size`` groups,
``pack = 32 / bits``):

- ``qweight`` int32 ``[K / pack, N]``: values packed along the **input** dim, lowest bits first;
- ``qzeros`` int32 ``[G, N / pack]``: zero points packed along the **output** dim;
  ``checkpoint_format: gptq`` (v1) stores ``zero - 1``, ``gptq_v2`` the zero itself;
- ``scales`` ``[G, N]``; ``g_idx`` int32 ``[K]`` (the group of each input column,
  meaningful with ``desc_act``).

Layers the config leaves unquantized (``lm_head`` unless ``lm_head: true``; the
``modules_to_not_convert`` list; GPTQModel ``dynamic`` entries starting ``-:``)
keep the dense method.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from glowlm.errors import ModelLoadError
from glowlm.layers.quantization import QuantizationConfig
from glowlm.layers.quantization.kernels import QuantKernels, WeightOnlyInt
from glowlm.layers.quantization.method import (
    QuantLinearMethod,
    add_param,
    check_divisible,
    group_perm,
    unpack_int32,
)
from glowlm.ops.linear import LinearMethod


def skipped(prefix: str, not_convert: Sequence[str], quantize_lm_head: bool = False) -> bool:
    """Whether the layer at ``prefix`` is left unquantized by name lists (HF's rule:
    any listed name that occurs in the prefix)."""
    if prefix.endswith("lm_head") and not quantize_lm_head:
        return True
    return any(name and name in prefix for name in not_convert)


class GPTQConfig(QuantizationConfig):
    name = "gptq"

    def __init__(self, bits: int, group_size: int, desc_act: bool, sym: bool, v2: bool,
                 lm_head: bool, not_convert: Sequence[str], dynamic: dict[str, Any]) -> None:
        super().__init__()
        self.bits, self.group_size, self.desc_act, self.sym = bits, group_size, desc_act, sym
        self.v2, self.lm_head, self.not_convert, self.dynamic = v2, lm_head, not_convert, dynamic

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GPTQConfig:
        bits = int(config.get("bits", 4))
        if bits not in (4, 8):
            raise ModelLoadError(f"GPTQ with {bits}-bit weights is not supported (4 or 8)")
        fmt = str(config.get("checkpoint_format", "gptq")).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise ModelLoadError(f"GPTQ checkpoint_format {fmt!r} is not supported "
                                 "(gptq, gptq_v2)")
        return cls(bits, int(config.get("group_size", 128)), bool(config.get("desc_act")),
                   bool(config.get("sym", True)), fmt == "gptq_v2",
                   bool(config.get("lm_head", False)),
                   list(config.get("modules_to_not_convert") or []),
                   dict(config.get("dynamic") or {}))

    def _dynamic_skip(self, prefix: str) -> bool:
        return any(key.startswith("-:") and re.match(key[2:], prefix) for key in self.dynamic)

    def linear_method(self, prefix: str) -> LinearMethod | None:
        if skipped(prefix, self.not_convert, self.lm_head) or self._dynamic_skip(prefix):
            return None
        return GPTQLinearMethod(self, self.kernels())


class GPTQLinearMethod(QuantLinearMethod):
    param_names = ("qweight", "qzeros", "scales", "g_idx")

    def __init__(self, config: GPTQConfig, kernels: QuantKernels) -> None:
        super().__init__(kernels)
        self.config = config

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: Sequence[int], params_dtype: torch.dtype
                       ) -> None:
        c = self.config
        pack = 32 // c.bits
        n = sum(output_partition_sizes)
        prefix = getattr(layer, "prefix", "?")
        group = input_size if c.group_size == -1 else c.group_size
        check_divisible(input_size, group, "input size", prefix)
        check_divisible(input_size, pack, "input size", prefix)
        for size in output_partition_sizes:
            check_divisible(size, pack, "output size", prefix)
        groups = input_size // group
        layer.quant_group = group
        add_param(layer, "qweight", (input_size // pack, n), torch.int32, input_dim=0,
                  output_dim=1, packed_dim=0, packed_factor=pack)
        add_param(layer, "qzeros", (groups, n // pack), torch.int32, output_dim=1,
                  packed_dim=1, packed_factor=pack)
        add_param(layer, "scales", (groups, n), params_dtype, output_dim=1)
        if c.desc_act:
            add_param(layer, "g_idx", (input_size,), torch.int32, input_dim=0)

    def canonical(self, layer: nn.Module) -> WeightOnlyInt:
        c = self.config
        q = unpack_int32(layer.qweight.data, c.bits, dim=0).t()
        zeros = unpack_int32(layer.qzeros.data, c.bits, dim=1).t().float()
        if not c.v2:
            zeros = zeros + 1  # v1 stores zero - 1 (symmetric 4-bit: 8 stored as 7)
        perm = None
        if c.desc_act:
            perm = group_perm(layer.g_idx.data, layer.quant_group, layer.prefix)
            if perm is not None:
                q = q.index_select(1, perm)
        return WeightOnlyInt(q.to(torch.uint8).contiguous(), layer.scales.data.t().float()
                             .contiguous(), zeros.contiguous(), c.bits, layer.quant_group, perm)
