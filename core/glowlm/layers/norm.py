"""Normalisation layers; both go through the platform's ops."""

from __future__ import annotations

import torch
from torch import nn

from glowlm.layers.context import ModelParts


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, parts: ModelParts) -> None:
        super().__init__()
        self.eps = eps
        self.ops = parts.ops
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=parts.dtype),
                                   requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Plain norm, or ``(norm(x + residual), x + residual)`` when a residual is given."""
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.fused_add_rms_norm(x, residual, self.weight, self.eps)


class LayerNorm(nn.LayerNorm):
    """torch's LayerNorm parameters; the norm itself is the platform's ``layer_norm`` op.

    A fused decoder layer calls the same kernel, so its results equal the module path's.
    """

    def __init__(self, hidden_size: int, eps: float, parts: ModelParts) -> None:
        super().__init__(hidden_size, eps=eps, dtype=parts.dtype)
        self.ops = parts.ops
        self.weight.requires_grad_(False)
        self.bias.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.layer_norm(x, self.weight, self.bias, self.eps)
