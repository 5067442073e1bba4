"""The attention layer models use: projections are theirs, paged attention is the backend's."""

from __future__ import annotations

import torch
from torch import nn

from glowlm.attention.backend import AttentionLayerSpec, AttentionMetadata
from glowlm.layers.context import ModelParts


class Attention(nn.Module):
    """Calls the platform's attention backend on this layer's slice of the KV cache.

    ``layer_index`` selects the cache in the step's ``kv_caches`` list, which the
    model runner allocates once and passes with every forward. ``sliding_window``
    and ``logits_soft_cap`` go to the backend in the layer's spec
    (:class:`~glowlm.attention.backend.AttentionLayerSpec` says what it means).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_size: int, scale: float,
                 layer_index: int, parts: ModelParts, sliding_window: int | None = None,
                 logits_soft_cap: float | None = None) -> None:
        super().__init__()
        tp = parts.parallel.tp_size
        self.spec = AttentionLayerSpec(num_heads // tp, max(1, num_kv_heads // tp), head_size,
                                       scale, sliding_window, logits_soft_cap)
        self.layer_index = layer_index
        assert parts.attention_backend is not None
        self.backend = parts.attention_backend

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata) -> torch.Tensor:
        s = self.spec
        return self.backend.forward(
            s, q.view(-1, s.num_heads, s.head_size), k.view(-1, s.num_kv_heads, s.head_size),
            v.view(-1, s.num_kv_heads, s.head_size), kv_caches[self.layer_index], metadata)
