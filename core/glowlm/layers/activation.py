"""Activations, through the platform's ops table."""

from __future__ import annotations

import torch
from torch import nn

from glowlm.errors import ModelLoadError
from glowlm.layers.context import ModelParts


class SiluAndMul(nn.Module):
    def __init__(self, parts: ModelParts) -> None:
        super().__init__()
        self.fn = parts.ops.silu_and_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class Activation(nn.Module):
    def __init__(self, name: str, parts: ModelParts) -> None:
        super().__init__()
        table = {"gelu": parts.ops.gelu, "gelu_new": parts.ops.gelu_tanh,
                 "gelu_pytorch_tanh": parts.ops.gelu_tanh, "relu": parts.ops.relu}
        if name not in table:
            raise ModelLoadError(f"activation {name!r} is not supported "
                                 f"(supported: {', '.join(table)})")
        self.fn = table[name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)
