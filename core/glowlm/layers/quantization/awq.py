"""AWQ checkpoints (``quant_method: awq``, AutoAWQ's GEMM layout, 4-bit).

Per linear layer: ``qweight`` int32 ``[K, N / 8]`` and ``qzeros`` int32
``[K / group_size, N / 8]``, both packed along the **output** dim with the logical
columns interleaved 0, 2, 4, 6, 1, 3, 5, 7 inside each word; ``scales``
``[K / group_size, N]``. Zero points are asymmetric and stored as is.
``modules_to_not_convert`` (and ``lm_head``) stay dense.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from glowlm.errors import ModelLoadError
from glowlm.layers.quantization import QuantizationConfig
from glowlm.layers.quantization.gptq import skipped
from glowlm.layers.quantization.kernels import QuantKernels, WeightOnlyInt
from glowlm.layers.quantization.method import (
    AWQ_ORDER,
    QuantLinearMethod,
    add_param,
    check_divisible,
    unpack_int32,
)
from glowlm.ops.linear import LinearMethod


class AWQConfig(QuantizationConfig):
    name = "awq"

    def __init__(self, group_size: int, zero_point: bool, not_convert: Sequence[str]) -> None:
        super().__init__()
        self.bits, self.group_size, self.zero_point = 4, group_size, zero_point
        self.not_convert = not_convert

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AWQConfig:
        bits = int(config.get("bits", config.get("w_bit", 4)))
        if bits != 4:
            raise ModelLoadError(f"AWQ with {bits}-bit weights is not supported (4-bit only)")
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ModelLoadError(f"AWQ version {version!r} is not supported (the GEMM layout "
                                 "only)")
        group = int(config.get("group_size", config.get("q_group_size", 128)))
        return cls(group, bool(config.get("zero_point", True)),
                   list(config.get("modules_to_not_convert") or []))

    def linear_method(self, prefix: str) -> LinearMethod | None:
        if skipped(prefix, self.not_convert):
            return None
        return AWQLinearMethod(self, self.kernels())


class AWQLinearMethod(QuantLinearMethod):
    param_names = ("qweight", "qzeros", "scales")

    def __init__(self, config: AWQConfig, kernels: QuantKernels) -> None:
        super().__init__(kernels)
        self.config = config

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: Sequence[int], params_dtype: torch.dtype
                       ) -> None:
        n = sum(output_partition_sizes)
        prefix = getattr(layer, "prefix", "?")
        group = input_size if self.config.group_size == -1 else self.config.group_size
        check_divisible(input_size, group, "input size", prefix)
        for size in output_partition_sizes:
            check_divisible(size, 8, "output size", prefix)
        layer.quant_group = group
        add_param(layer, "qweight", (input_size, n // 8), torch.int32, input_dim=0,
                  output_dim=1, packed_dim=1, packed_factor=8)
        add_param(layer, "qzeros", (input_size // group, n // 8), torch.int32, output_dim=1,
                  packed_dim=1, packed_factor=8)
        add_param(layer, "scales", (input_size // group, n), params_dtype, output_dim=1)

    def canonical(self, layer: nn.Module) -> WeightOnlyInt:
        inverse = torch.tensor([AWQ_ORDER.index(c) for c in range(8)])

        def unpack(t: torch.Tensor) -> torch.Tensor:  # [R, N/8] -> [R, N], logical order
            u = unpack_int32(t, 4, dim=1).view(t.shape[0], -1, 8)
            return u.index_select(2, inverse).reshape(t.shape[0], -1)

        q = unpack(layer.qweight.data).t()
        if self.config.zero_point:
            zeros = unpack(layer.qzeros.data).t().float()
        else:
            zeros = torch.full((q.shape[0], q.shape[1] // layer.quant_group), 8.0)
        return WeightOnlyInt(q.to(torch.uint8).contiguous(),
                             layer.scales.data.t().float().contiguous(), zeros.contiguous(), 4,
                             layer.quant_group)
