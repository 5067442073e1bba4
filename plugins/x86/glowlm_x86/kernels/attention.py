"""The x86 attention backend: compiled paged attention over core's cache layout.

The KV cache keeps the reference layout ``[2, num_blocks, num_kv_heads,
block_size, head_size]`` (so prefix-cache block copies and the reference
fallback work unchanged). Per layer: one ``write_kv`` call stores the step's new
K/V, one ``paged_attention`` call attends every sequence (decodes and prefill
chunks alike). Shapes the kernel does not cover (a head or block size that is
not a multiple of the SIMD width) use core's reference backend instead.

A layer with a sliding window (Gemma 3's local layers) runs the plain kernel while
every sequence of the step fits inside the window, where the window hides nothing,
and ``paged_attention_window`` (the same kernel, attending only keys ``p`` with
``q - window < p <= q``) once some sequence is longer: the very kernel Gemma 3's
fused stack runs, so the module path and the stack agree past the window too.
Layers with soft-capped scores (Gemma 2) run core's reference attention.
"""

from __future__ import annotations

import torch
from glowlm.plugin_api import (
    AttentionBackend,
    AttentionLayerSpec,
    AttentionMetadata,
    ReferenceAttentionBackend,
)

from glowlm_x86.kernels import ops

#: Cache dtypes the kernel reads: the float types, the 8-bit floats of
#: ``--kv-cache-dtype fp8`` / ``fp8_e5m2``, and ``int8`` (rows of values and their fp16
#: scale), widened to fp32 in registers as they are read (never into a copy of the
#: cache), so decode attention reads about half of bf16's bytes.
KV_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
             torch.float8_e5m2, torch.int8)


class X86AttentionBackend(AttentionBackend):
    """Compiled decode + chunked-prefill attention (GQA/MQA; fp32/bf16/fp16/fp8/int8 KV)."""

    name = "x86"

    def __init__(self, vector_width: int) -> None:
        self.vector_width = vector_width
        self._reference = ReferenceAttentionBackend()

    def supports(self, head_size: int, block_size: int, kv_dtype: torch.dtype) -> bool:
        """Whether the compiled kernel handles this layer shape and cache dtype."""
        w = self.vector_width
        return head_size % w == 0 and block_size % w == 0 and kv_dtype in KV_DTYPES

    @staticmethod
    def kernel_covers(layer: AttentionLayerSpec, metadata: AttentionMetadata) -> bool:
        """Whether the plain kernel's full causal attention is this layer's attention in
        this step: no sequence is longer than the layer's window (a query at position q
        sees keys p > q - window, so a context within the window hides none); otherwise
        the windowed kernel runs."""
        return layer.sliding_window is None or metadata.max_seq_len <= layer.sliding_window

    def forward(self, layer: AttentionLayerSpec, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
                ) -> torch.Tensor:
        if not self.supports(layer.head_size, metadata.block_size, kv_cache.dtype) \
                or layer.logits_soft_cap is not None:  # the kernels have no score cap
            return self._reference.forward(layer, query, key, value, kv_cache, metadata)
        ops.write_kv(kv_cache, key, value, metadata.slot_mapping)
        if self.kernel_covers(layer, metadata):
            out = ops.paged_attention(query, kv_cache, metadata.block_tables,
                                      metadata.query_start_loc, metadata.seq_lens, layer.scale)
        else:
            out = ops.paged_attention_window(query, kv_cache, metadata.block_tables,
                                             metadata.query_start_loc, metadata.seq_lens,
                                             layer.scale, layer.sliding_window)
        return out.flatten(1)
