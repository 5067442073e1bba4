"""Rotary position embeddings, including Llama 3's frequency scaling.

The cos/sin table is built once per model in float32 for every position up to
the context length; the per-token rotation is the platform's
``rotary_embedding`` op.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from glowlm.errors import ModelLoadError
from glowlm.layers.context import ModelParts


def rope_settings(config: Any) -> tuple[float, dict[str, Any] | None]:
    """``(theta, scaling)`` from a transformers config, old (``rope_theta`` +
    ``rope_scaling``) or new (``rope_parameters``) style."""
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or params or None
    theta = params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "default":
            scaling = None
    return float(theta), scaling


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 scaling: keep high frequencies, divide low ones by ``factor``, blend between."""
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 is_neox: bool, scaling: dict[str, Any] | None, parts: ModelParts) -> None:
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.is_neox = is_neox
        self.op = parts.ops.rotary_embedding
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64)
                                   / rotary_dim))
        attention_factor = 1.0
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind == "llama3":
                inv_freq = _llama3_inv_freq(inv_freq, scaling)
            elif kind == "linear":
                inv_freq = inv_freq / float(scaling["factor"])
            else:
                raise ModelLoadError(f"rope scaling {kind!r} is not supported "
                                     "(supported: default, linear, llama3)")
        t = torch.arange(max_position, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1) * attention_factor
        self.register_buffer("cos_sin_cache", cache.float(), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k: ``[tokens, heads, head_size]``."""
        return self.op(positions, q, k, self.cos_sin_cache, self.rotary_dim, self.is_neox)
