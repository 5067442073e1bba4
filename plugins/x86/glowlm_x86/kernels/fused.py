"""The x86 fused decoder-layer ops (see :mod:`glowlm.ops.fused` for the contract).

``ln_decoder_layer`` runs a pre-LayerNorm layer (OPT, GPT-2) and
``rms_decoder_layer`` an RMSNorm layer (the Llama family) as one compiled call:
the same GEMV/GEMM choice as :func:`glowlm_x86.kernels.linear.dense_linear`, the same
``write_kv`` and ``paged_attention`` calls as :class:`X86AttentionBackend` (and the
same norm, rotary and activation kernels as the x86 ops table), in the module
path's order, so results are identical to running the modules. They decline
(return ``None``) whatever those kernels would not run themselves: cache shapes
the attention kernel does not cover, weight dtypes outside fp32/bf16/fp16, and
(``ln_decoder_layer``, whose layers have none) grouped KV heads.
"""

from __future__ import annotations

import torch
from glowlm.attention.backend import AttentionLayerSpec, AttentionMetadata
from glowlm.ops.fused import (
    LnDecoderLayerFn,
    LnDecoderWeights,
    RmsDecoderLayerFn,
    RmsDecoderWeights,
)

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


def make_rms_decoder_layer(policy: GemmPolicy, attention: X86AttentionBackend
                           ) -> RmsDecoderLayerFn:
    def rms_decoder_layer(positions: torch.Tensor, x: torch.Tensor,
                          residual: torch.Tensor | None, w: RmsDecoderWeights,
                          kv_cache: torch.Tensor, metadata: AttentionMetadata,
                          spec: AttentionLayerSpec) -> tuple[torch.Tensor, torch.Tensor] | None:
        if (x.dim() != 2
                or not attention.supports(spec.head_size, metadata.block_size, kv_cache.dtype)
                or w.qkv_weight.dtype not in KERNEL_DTYPES
                or w.gate_up_weight.dtype not in KERNEL_DTYPES):
            return None
        return torch.ops.glowlm_x86.rms_decoder_layer(
            positions, x, residual, w.ln1_weight, w.qkv_weight, w.qkv_bias, w.q_norm_weight,
            w.k_norm_weight, w.cos_sin_cache, w.rotary_dim, w.is_neox, w.o_weight, w.o_bias,
            w.ln2_weight, w.gate_up_weight, w.gate_up_bias, w.down_weight, w.down_bias,
            kv_cache, metadata.block_tables, metadata.query_start_loc, metadata.seq_lens,
            metadata.slot_mapping, spec.num_heads, spec.num_kv_heads, spec.head_size,
            spec.scale, w.eps, policy.gemv_max_m)

    return rms_decoder_layer
