"""Typed wrappers over ``torch.ops.glowlm_x86`` and their fake (meta) implementations.

Each wrapper has the signature of the function of the same name in
:mod:`glowlm.ops.reference` (or documents its own contract), so an
:class:`~glowlm.ops.table.OpsTable` can hold it. The wrappers only work after
:func:`glowlm_x86.kernels.build.load_kernels` succeeded; :func:`register_fakes`
then gives every op a shape-only implementation so ``torch.compile`` can trace it.
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor

#: Every op the compiled module defines (shown in ``Capabilities.kernels``).
OP_NAMES = ("rms_norm", "fused_add_rms_norm", "layer_norm", "rotary_embedding", "silu_and_mul",
            "gelu", "gelu_tanh", "relu", "gemv", "gemm", "fused_moe", "lora_shrink_expand",
            "packed_width", "pack_blocks", "pack_blocks_into", "gemm_packed", "write_kv",
            "paged_attention", "paged_attention_window",
            "ln_decoder_layer", "rms_decoder_layer", "ln_decoder_stack", "rms_decoder_stack",
            "rms_decoder_stack_q", "gemma_decoder_stack", "shm_all_reduce")


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return torch.ops.glowlm_x86.rms_norm(x, weight, eps)


def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float
                       ) -> tuple[Tensor, Tensor]:
    return torch.ops.glowlm_x86.fused_add_rms_norm(x, residual, weight, eps)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    return torch.ops.glowlm_x86.layer_norm(x, weight, bias, eps)


def rotary_embedding(positions: Tensor, query: Tensor, key: Tensor, cos_sin_cache: Tensor,
                     rotary_dim: int, is_neox: bool) -> tuple[Tensor, Tensor]:
    return torch.ops.glowlm_x86.rotary_embedding(positions, query, key, cos_sin_cache,
                                                 rotary_dim, is_neox)


def silu_and_mul(x: Tensor) -> Tensor:
    return torch.ops.glowlm_x86.silu_and_mul(x)


def gelu(x: Tensor) -> Tensor:
    return torch.ops.glowlm_x86.gelu(x)


def gelu_tanh(x: Tensor) -> Tensor:
    return torch.ops.glowlm_x86.gelu_tanh(x)


def relu(x: Tensor) -> Tensor:
    return torch.ops.glowlm_x86.relu(x)


def shm_all_reduce(x: Tensor, state: Tensor) -> None:
    """Sum ``x`` over a shared-memory group in place (``OpsTable.shm_all_reduce``)."""
    torch.ops.glowlm_x86.shm_all_reduce(x, state)


def gemv(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` streaming the weight once (fp32 accumulate); ``x``: [M, K]."""
    return torch.ops.glowlm_x86.gemv(x, weight, bias)


def gemm(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` by the blocked GEMM (weights converted in registers)."""
    return torch.ops.glowlm_x86.gemm(x, weight, bias)


def fused_moe(x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
              activation: str = "silu", gemv_max_m: int = 8) -> Tensor:
    """A MoE layer's routed experts grouped by expert (``reference.fused_moe``'s contract):
    each routed expert's gate|up and down as one GEMV (up to ``gemv_max_m`` of its tokens)
    or GEMM over its tokens, the weighted sum in fp32."""
    return torch.ops.glowlm_x86.fused_moe(x, w13, w2, topk_weights, topk_ids, activation,
                                          gemv_max_m)


def lora_shrink_expand(y: Tensor, x: Tensor, a: Tensor, b: Tensor,
                       groups: list[tuple[int, Tensor | None]], slots: Tensor | None = None,
                       gemv_max_m: int = 8) -> Tensor:
    """LoRA updates on their rows (``reference.lora_shrink_expand``'s contract): each used
    slot's rows gathered once, shrink and expand as GEMVs (GEMMs above ``gemv_max_m``
    rows), the intermediate in fp32."""
    if slots is None:
        from glowlm.plugin_api import reference_ops

        slots = reference_ops.lora_row_slots(groups, x.shape[0])
    return torch.ops.glowlm_x86.lora_shrink_expand(y, x, a, b, slots, gemv_max_m)


def packed_width(dtype: torch.dtype) -> int:
    """Lanes per block of :func:`pack_blocks`' layout for weights of ``dtype`` in the
    loaded kernel build: W for float32, and for bfloat16 where the build has the pairwise
    bf16 dot product (AVX512_BF16); 0 otherwise (the packed ops then refuse)."""
    return int(torch.ops.glowlm_x86.packed_width(dtype))


def pack_blocks(weight: Tensor) -> Tensor:
    """A ``[N, K]`` weight as ``[ceil(N / W), K / S, W, S]`` (S = 2 for bf16 pairs, 1 for
    float32): per block of W rows, each step of k as one vector, row r's in lane r
    (cpu/gemm_packed.h)."""
    return torch.ops.glowlm_x86.pack_blocks(weight)


def packed_shape(weight: Tensor) -> tuple[int, int, int, int]:
    """The shape of :func:`pack_blocks`' copy of ``weight`` in the loaded kernel build."""
    width, step = packed_width(weight.dtype), 2 if weight.dtype == torch.bfloat16 else 1
    return ((weight.shape[0] + width - 1) // width, weight.shape[1] // step, width, step)


def pack_blocks_into(weight: Tensor, out: Tensor) -> None:
    """:func:`pack_blocks` into ``out`` (contiguous, :func:`packed_shape`): the copy lands
    where the caller mapped it (huge pages) without a second pass over it."""
    torch.ops.glowlm_x86.pack_blocks_into(weight, out)


def gemm_packed(x: Tensor, packed: Tensor, n: int, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` for ``x`` [M, K] of the weight's dtype on
    :func:`pack_blocks`' copy of the ``[n, K]`` weight (fp32 sums, output in x's dtype)."""
    return torch.ops.glowlm_x86.gemm_packed(x, packed, n, bias)


def write_kv(kv_cache: Tensor, key: Tensor, value: Tensor, slot_mapping: Tensor) -> None:
    """Store ``key``/``value`` ``[tokens, kv_heads, head]`` at ``slot_mapping`` (in place)."""
    torch.ops.glowlm_x86.write_kv(kv_cache, key, value, slot_mapping)


def paged_attention(query: Tensor, kv_cache: Tensor, block_tables: Tensor,
                    query_start_loc: Tensor, seq_lens: Tensor, scale: float) -> Tensor:
    """Causal attention of ``query`` ``[tokens, heads, head]`` over the paged cache."""
    return torch.ops.glowlm_x86.paged_attention(query, kv_cache, block_tables,
                                                query_start_loc, seq_lens, scale)


def paged_attention_window(query: Tensor, kv_cache: Tensor, block_tables: Tensor,
                           query_start_loc: Tensor, seq_lens: Tensor, scale: float,
                           window: int) -> Tensor:
    """:func:`paged_attention` over the last ``window`` positions only: a query at
    position ``q`` attends keys ``p`` with ``q - window < p <= q`` (0: every key)."""
    return torch.ops.glowlm_x86.paged_attention_window(query, kv_cache, block_tables,
                                                       query_start_loc, seq_lens, scale,
                                                       window)


_fakes_lock = threading.Lock()
_fakes_registered = False


def register_fakes() -> None:
    """Register the meta implementations (once per process, after the module loaded)."""
    global _fakes_registered
    with _fakes_lock:
        if _fakes_registered:
            return
        _register_fakes()
        _fakes_registered = True


def _register_fakes() -> None:
    reg = torch.library.register_fake

    @reg("glowlm_x86::rms_norm")
    def _(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        return x.new_empty(x.shape)

    @reg("glowlm_x86::fused_add_rms_norm")
    def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        return x.new_empty(x.shape), x.new_empty(x.shape)

    @reg("glowlm_x86::layer_norm")
    def _(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
        return x.new_empty(x.shape)

    @reg("glowlm_x86::rotary_embedding")
    def _(positions: Tensor, query: Tensor, key: Tensor, cos_sin_cache: Tensor,
          rotary_dim: int, is_neox: bool) -> tuple[Tensor, Tensor]:
        return query.new_empty(query.shape), key.new_empty(key.shape)

    @reg("glowlm_x86::silu_and_mul")
    def _(x: Tensor) -> Tensor:
        return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))

    @reg("glowlm_x86::gelu")
    def _(x: Tensor) -> Tensor:
        return x.new_empty(x.shape)

    @reg("glowlm_x86::gelu_tanh")
    def _(x: Tensor) -> Tensor:
        return x.new_empty(x.shape)

    @reg("glowlm_x86::relu")
    def _(x: Tensor) -> Tensor:
        return x.new_empty(x.shape)

    @reg("glowlm_x86::gemv")
    def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return x.new_empty((x.shape[0], weight.shape[0]))

    @reg("glowlm_x86::gemm")
    def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return x.new_empty((x.shape[0], weight.shape[0]))

    @reg("glowlm_x86::lora_shrink_expand")
    def _(y: Tensor, x: Tensor, a: Tensor, b: Tensor, slots: Tensor, gemv_max_m: int
          ) -> Tensor:
        return torch.empty_like(y)

    @reg("glowlm_x86::fused_moe")
    def _(x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
          activation: str, gemv_max_m: int) -> Tensor:
        return x.new_empty(x.shape)

    @reg("glowlm_x86::pack_blocks")
    def _(weight: Tensor) -> Tensor:
        return weight.new_empty(packed_shape(weight))

    @reg("glowlm_x86::pack_blocks_into")
    def _(weight: Tensor, out: Tensor) -> None:
        return None

    @reg("glowlm_x86::gemm_packed")
    def _(x: Tensor, packed: Tensor, n: int, bias: Tensor | None) -> Tensor:
        return x.new_empty((x.shape[0], n))

    @reg("glowlm_x86::write_kv")
    def _(kv_cache: Tensor, key: Tensor, value: Tensor, slot_mapping: Tensor) -> None:
        return None

    @reg("glowlm_x86::paged_attention")
    def _(query: Tensor, kv_cache: Tensor, block_tables: Tensor, query_start_loc: Tensor,
          seq_lens: Tensor, scale: float) -> Tensor:
        return query.new_empty(query.shape)

    @reg("glowlm_x86::paged_attention_window")
    def _(query: Tensor, kv_cache: Tensor, block_tables: Tensor, query_start_loc: Tensor,
          seq_lens: Tensor, scale: float, window: int) -> Tensor:
        return query.new_empty(query.shape)

    @reg("glowlm_x86::ln_decoder_layer")
    def _(x: Tensor, ln1_w: Tensor, ln1_b: Tensor | None, qkv_w: Tensor, qkv_b: Tensor | None,
          out_w: Tensor, out_b: Tensor | None, ln2_w: Tensor, ln2_b: Tensor | None, fc1_w: Tensor,
          fc1_b: Tensor | None, fc2_w: Tensor, fc2_b: Tensor | None, kv_cache: Tensor,
          block_tables: Tensor, query_start_loc: Tensor, seq_lens: Tensor,
          slot_mapping: Tensor, num_heads: int, scale: float, eps: float, activation: str,
          gemv_max_m: int) -> Tensor:
        return x.new_empty(x.shape)

    @reg("glowlm_x86::rms_decoder_layer")
    def _(positions: Tensor, x: Tensor, residual: Tensor | None, ln1_w: Tensor, qkv_w: Tensor,
          qkv_b: Tensor | None, q_norm_w: Tensor | None, k_norm_w: Tensor | None,
          cos_sin_cache: Tensor, rotary_dim: int, is_neox: bool, o_w: Tensor,
          o_b: Tensor | None, ln2_w: Tensor, gate_up_w: Tensor, gate_up_b: Tensor | None,
          down_w: Tensor, down_b: Tensor | None, kv_cache: Tensor, block_tables: Tensor,
          query_start_loc: Tensor, seq_lens: Tensor, slot_mapping: Tensor, num_heads: int,
          num_kv_heads: int, head_size: int, scale: float, eps: float, gemv_max_m: int
          ) -> tuple[Tensor, Tensor]:
        return x.new_empty(x.shape), x.new_empty(x.shape)

    @reg("glowlm_x86::ln_decoder_stack")
    def _(x: Tensor, weights: list[Tensor | None], kv_caches: list[Tensor], block_tables: Tensor,
          query_start_loc: Tensor, seq_lens: Tensor, slot_mapping: Tensor, num_heads: int,
          scale: float, eps: float, activation: str, gemv_max_m: int,
          tp: Tensor | None = None) -> Tensor:
        return x.new_empty(x.shape)

    @reg("glowlm_x86::rms_decoder_stack")
    def _(positions: Tensor, x: Tensor, residual: Tensor | None, weights: list[Tensor | None],
          kv_caches: list[Tensor], cos_sin_cache: Tensor, rotary_dim: int, is_neox: bool,
          block_tables: Tensor, query_start_loc: Tensor, seq_lens: Tensor,
          slot_mapping: Tensor, num_heads: int, num_kv_heads: int, head_size: int,
          scale: float, eps: float, gemv_max_m: int) -> tuple[Tensor, Tensor]:
        return x.new_empty(x.shape), x.new_empty(x.shape)

    @reg("glowlm_x86::rms_decoder_stack_q")
    def _(positions: Tensor, x: Tensor, residual: Tensor | None, weights: list[Tensor | None],
          quant: list[Tensor | None], info: list[int], kv_caches: list[Tensor],
          cos_sin_cache: Tensor, rotary_dim: int, is_neox: bool, block_tables: Tensor,
          query_start_loc: Tensor, seq_lens: Tensor, slot_mapping: Tensor, num_heads: int,
          num_kv_heads: int, head_size: int, scale: float, eps: float, gemv_max_m: int,
          tp: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return x.new_empty(x.shape), x.new_empty(x.shape)

    @reg("glowlm_x86::gemma_decoder_stack")
    def _(positions: Tensor, x: Tensor, residual: Tensor | None, weights: list[Tensor | None],
          quant: list[Tensor | None], info: list[int], windows: list[int],
          kv_caches: list[Tensor], rotary_dim: int, is_neox: bool, block_tables: Tensor,
          query_start_loc: Tensor, seq_lens: Tensor, slot_mapping: Tensor, num_heads: int,
          num_kv_heads: int, head_size: int, scale: float, eps: float, gemv_max_m: int,
          tp: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return x.new_empty(x.shape), x.new_empty(x.shape)
