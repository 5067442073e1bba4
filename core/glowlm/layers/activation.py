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


#: A gated MLP's ``hidden_act`` / ``hidden_activation`` -> the ops-table entry that
#: applies it to the gate half of the fused gate/up projection and multiplies by the rest.
GATED_ACTIVATION_OPS = {"silu": "silu_and_mul", "gelu_pytorch_tanh": "gelu_tanh_and_mul"}


class GatedActivation(nn.Module):
    """``act(gate) * up`` on ``[..., 2 * d]`` (SwiGLU, GeGLU) through the platform's op."""

    def __init__(self, name: str, parts: ModelParts) -> None:
        super().__init__()
        if name not in GATED_ACTIVATION_OPS:
            raise ModelLoadError(f"gated activation {name!r} is not supported "
                                 f"(supported: {', '.join(GATED_ACTIVATION_OPS)})")
        self.fn = getattr(parts.ops, GATED_ACTIVATION_OPS[name])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


#: ``config.activation_function`` -> the ops-table entry (and fused-layer name) for it.
ACTIVATION_OPS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "relu": "relu"}


class Activation(nn.Module):
    def __init__(self, name: str, parts: ModelParts) -> None:
        super().__init__()
        if name not in ACTIVATION_OPS:
            raise ModelLoadError(f"activation {name!r} is not supported "
                                 f"(supported: {', '.join(ACTIVATION_OPS)})")
        self.fn = getattr(parts.ops, ACTIVATION_OPS[name])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)
