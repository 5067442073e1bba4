"""The compiled op's Python side: loading it, its fake (meta) kernel, a typed wrapper.

``import glowlm_example._C`` loads the library built at install and registers
``torch.ops.glowlm_example.rms_norm`` (csrc/rms_norm.cpp). The fake kernel tells
``torch.compile`` and ``torch.library.opcheck`` the output's shape and dtype without
running it; the tests check both with ``opcheck``.
"""

from __future__ import annotations

import torch

from glowlm_example import _C  # noqa: F401 - registers torch.ops.glowlm_example


@torch.library.register_fake("glowlm_example::rms_norm")
def _rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    torch._check(weight.dim() == 1 and weight.shape[0] == x.shape[-1],
                 lambda: f"rms_norm: weight must be [{x.shape[-1]}]")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``glowlm.ops.reference.rms_norm``, compiled."""
    return torch.ops.glowlm_example.rms_norm(x, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``glowlm.ops.reference.fused_add_rms_norm`` on the compiled norm: the sum is
    rounded to the activation dtype first, as the reference does."""
    residual = x + residual
    return rms_norm(residual, weight, eps), residual
