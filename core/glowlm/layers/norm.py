"""Normalisation layers; both go through the platform's ops."""

from __future__ import annotations

import torch
from torch import nn

from glowlm.layers.context import ModelParts
from glowlm.layers.weights import copy_checked


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


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: ``x / rms(x) * (1 + w)``, math in float32, rounded once.

    Checkpoints store ``w`` (zero-centred); transformers' ``Gemma3RMSNorm`` adds 1 in
    float32 on every call. Here the weight loader adds it once and keeps ``1 + w`` in
    float32 whatever the model dtype: the platform's standard ``rms_norm`` op, given a
    float32 weight, multiplies in float32 and rounds once, which is Gemma's formula
    exactly (a bf16 ``1 + w`` would lose ``w``'s low bits, and the rounding of
    ``x / rms(x)`` before the product would be Llama's order, not Gemma's). So no
    Gemma-specific norm op is needed. ``weight`` after loading is ``1 + w``; GGUF
    files, whose converter bakes the 1 in, are brought back to ``w`` by the loader.
    """

    def __init__(self, hidden_size: int, eps: float, parts: ModelParts, prefix: str) -> None:
        super().__init__(hidden_size, eps, parts)
        self.prefix = prefix
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=torch.float32),
                                   requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        copy_checked(param, loaded.float() + 1.0, f"{self.prefix}.weight")


class LayerNorm(nn.LayerNorm):
    """torch's LayerNorm parameters; the norm itself is the platform's ``layer_norm`` op.

    A fused decoder layer calls the same kernel, so its results equal the module path's.
    """

    def __init__(self, hidden_size: int, eps: float, parts: ModelParts,
                 bias: bool = True) -> None:
        super().__init__(hidden_size, eps=eps, dtype=parts.dtype, bias=bias)
        self.ops = parts.ops
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        else:  # no bias in the checkpoint (ModernBERT's norm_bias=False); the op takes one
            self.register_buffer("zero_bias", torch.zeros(hidden_size, dtype=parts.dtype),
                                 persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.bias is not None else self.zero_bias
        return self.ops.layer_norm(x, self.weight, bias, self.eps)
