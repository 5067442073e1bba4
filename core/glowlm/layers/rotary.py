"""Rotary position embeddings, with the scalings of :mod:`glowlm.layers.rope_scaling`.

The cos/sin table is built once per model in float32 for every position up to
the context length; the per-token rotation is the platform's
``rotary_embedding`` op.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from glowlm.layers.context import ModelParts
from glowlm.layers.rope_scaling import original_positions, rope_type, scaled_inv_freq


def rope_settings(config: Any) -> tuple[float, dict[str, Any] | None]:
    """``(theta, scaling)`` from a transformers config, old (``rope_theta`` +
    ``rope_scaling``) or new (``rope_parameters``) style."""
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or params or None
    theta = params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
    if rope_type(scaling) == "default":
        scaling = None
    return float(theta), scaling


def max_positions(config: Any, trained_positions: int) -> int:
    """Positions a checkpoint serves with its scaling (vLLM's rule): ``linear``,
    ``dynamic`` and ``yarn`` stretch the trained context by ``factor`` (YaRN's from
    ``original_max_position_embeddings``); ``llama3`` and ``longrope`` configs already
    give the stretched length as ``max_position_embeddings``."""
    scaling = rope_settings(config)[1]
    kind = rope_type(scaling)
    if scaling is None or kind not in ("linear", "dynamic", "yarn"):
        return trained_positions
    factor = scaling.get("factor")
    if not factor:
        return trained_positions
    base = original_positions(scaling, trained_positions) if kind == "yarn" else trained_positions
    return max(trained_positions, int(base * float(factor)))


def rotary_dim(config: Any, head_size: int) -> int:
    """Features of each head that rotate: ``partial_rotary_factor`` of them (Phi-4-mini's
    0.75; from ``rope_parameters`` in transformers 5, else the config), all by default."""
    params = getattr(config, "rope_parameters", None) or {}
    factor = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    factor = factor or getattr(config, "partial_rotary_factor", None) or 1.0
    return int(head_size * float(factor))


class RotaryEmbedding(nn.Module):
    """The cos/sin table of one rotary setting and the platform's rotation op.

    ``max_position``: positions the table holds. ``scaling``: the config's
    ``rope_scaling`` (:mod:`glowlm.layers.rope_scaling`; its ``attention_factor`` is
    folded into the table). ``trained_positions`` (the config's
    ``max_position_embeddings``) and ``context_len`` (the context the engine serves)
    fix the length-dependent scalings; both default to ``max_position``.
    """

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 is_neox: bool, scaling: dict[str, Any] | None, parts: ModelParts,
                 trained_positions: int | None = None, context_len: int | None = None
                 ) -> None:
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.is_neox = is_neox
        self.op = parts.ops.rotary_embedding
        inv_freq, attention_factor = scaled_inv_freq(
            base, rotary_dim, scaling, trained_positions or max_position,
            context_len or max_position)
        t = torch.arange(max_position, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1) * attention_factor
        self.register_buffer("cos_sin_cache", cache.float(), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k: ``[tokens, heads, head_size]``."""
        return self.op(positions, q, k, self.cos_sin_cache, self.rotary_dim, self.is_neox)
