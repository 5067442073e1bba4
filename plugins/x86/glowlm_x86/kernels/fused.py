"""The x86 fused decoder-layer op (see :mod:`glowlm.ops.fused` for the contract).

``ln_decoder_layer`` runs a pre-LayerNorm layer (OPT, GPT-2) as one compiled call:
the same GEMV/GEMM choice as :func:`glowlm_x86.kernels.linear.dense_linear`, the same
``write_kv`` and ``paged_attention`` calls as :class:`X86AttentionBackend`, in the
module path's order, so results are identical to running the modules. It declines
(returns ``None``) whatever those kernels would not run themselves: grouped-query
layers, cache shapes the attention kernel does not cover, weight dtypes outside
fp32/bf16/fp16.
"""

from __future__ import annotations

import torch
from glowlm.attention.backend import AttentionLayerSpec, AttentionMetadata
from glowlm.ops.fused import LnDecoderLayerFn, LnDecoderWeights

from glowlm_x86.kernels.attention import X86AttentionBackend
from glowlm_x86.kernels.linear import KERNEL_DTYPES, GemmPolicy


def make_ln_decoder_layer(policy: GemmPolicy, attention: X86AttentionBackend
                          ) -> LnDecoderLayerFn:
    def ln_decoder_layer(x: torch.Tensor, w: LnDecoderWeights, kv_cache: torch.Tensor,
                         metadata: AttentionMetadata, spec: AttentionLayerSpec
                         ) -> torch.Tensor | None:
        if (x.dim() != 2 or spec.num_kv_heads != spec.num_heads
                or not attention.supports(spec.head_size, metadata.block_size, kv_cache.dtype)
                or w.qkv_weight.dtype not in KERNEL_DTYPES
                or w.fc1_weight.dtype not in KERNEL_DTYPES):
            return None
        return torch.ops.glowlm_x86.ln_decoder_layer(
            x, w.ln1_weight, w.ln1_bias, w.qkv_weight, w.qkv_bias, w.out_weight, w.out_bias,
            w.ln2_weight, w.ln2_bias, w.fc1_weight, w.fc1_bias, w.fc2_weight, w.fc2_bias,
            kv_cache, metadata.block_tables, metadata.query_start_loc, metadata.seq_lens,
            metadata.slot_mapping, spec.num_heads, spec.scale, w.eps, w.activation,
            policy.gemv_max_m)

    return ln_decoder_layer
