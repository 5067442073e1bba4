"""The AttentionBackend interface.

One backend instance serves every attention layer of one engine. Per step the
model runner builds one :class:`AttentionMetadata` (via :meth:`build_metadata`)
and passes the same object to every layer: anything that depends only on the
batch (masks, gathered indices) is computed once there, not per layer.

Batch layout (the contract every backend relies on): the step's sequences are
ordered **decodes first** (one new token each), then prefill chunks. Tokens are
flattened in that order; ``query_start_loc[i]:query_start_loc[i+1]`` are
sequence ``i``'s new tokens, which sit at positions
``seq_lens[i] - query_lens[i] ... seq_lens[i] - 1`` of that sequence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

#: ``--kv-cache-dtype`` names (vLLM's, and glowlm's ``int8``) -> the cache's storage
#: dtype; ``auto`` is the model's dtype. ``fp8`` is E4M3 (vLLM's default fp8), with no
#: scale: K and V are stored as they are, saturated at ±448 (E4M3's largest finite value;
#: activations this large do not occur in the models glowlm runs, and saturating keeps an
#: outlier finite instead of NaN). E5M2 keeps fp16's range with 2 mantissa bits.
#: ``int8`` stores each row (one token's K or V of one kv head) as ``head_size`` int8
#: values and the row's fp16 scale (:func:`quantize_int8_rows`).
KV_CACHE_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "float": torch.float32,
    "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2, "int8": torch.int8,
}
#: Bytes an int8 cache row keeps after its ``head_size`` values: the row's fp16 scale.
INT8_SCALE_BYTES = 2
#: The 8-bit float cache dtypes and the largest finite value each stores.
FP8_MAX: dict[torch.dtype, float] = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The storage dtype of ``--kv-cache-dtype name`` for a model running in
    ``model_dtype`` (the config validated the name)."""
    return model_dtype if name == "auto" else KV_CACHE_DTYPES[name]


def to_cache(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in the cache's dtype: 8-bit floats saturate at their largest finite value
    (torch's E5M2 cast would give inf), rounding to nearest even as torch casts; an
    int8 cache takes the rows of :func:`quantize_int8_rows` (their scale appended)."""
    if dtype == torch.int8:
        return quantize_int8_rows(x)
    limit = FP8_MAX.get(dtype)
    if limit is not None:
        x = x.clamp(-limit, limit)
    return x.to(dtype)


def kv_row_size(head_size: int, dtype: torch.dtype) -> int:
    """Elements one cached row (one token, one kv head, K or V) occupies in a cache of
    ``dtype``: ``head_size``, plus the fp16 scale's two bytes in an int8 cache."""
    return head_size + INT8_SCALE_BYTES if dtype == torch.int8 else head_size


def quantize_int8_rows(x: torch.Tensor) -> torch.Tensor:
    """``[..., head_size]`` rows -> ``[..., head_size + 2]`` int8: the values
    ``round(x / s)`` in ``[-127, 127]`` and, in the last two bytes, ``s`` as fp16.

    Why one scale per row (per token and kv head) rather than per block: a block is
    written a token at a time, so a block-wide scale would either be fixed by the first
    token (saturating a later, larger one) or grow and requantize the rows already
    stored, adding a rounding at every growth. A row's scale is final when it is
    written, costs 2 bytes in ``head_size + 2`` (1.94x bf16's tokens at head 64), and
    folds into the score and the softmax weight of its key. ``s`` is ``amax / 127``
    rounded to fp16, and the values are divided by that rounded scale (the compiled
    kernels compute the same, so both write the same bytes); an all-zero row has
    ``s = 0`` and zero values."""
    xf = x.float()
    scale = (xf.abs().amax(-1, keepdim=True) / 127.0).to(torch.float16)
    sf = scale.float()
    q = torch.where(sf > 0, xf / torch.where(sf > 0, sf, 1.0), 0.0)
    q = q.round().clamp(-127, 127).to(torch.int8)
    return torch.cat([q, scale.view(torch.int8)], dim=-1)


def dequantize_int8_rows(rows: torch.Tensor, dtype: torch.dtype = torch.float32
                         ) -> torch.Tensor:
    """The inverse of :func:`quantize_int8_rows`: ``[..., head_size + 2]`` int8 rows ->
    ``[..., head_size]`` values ``q * s`` in ``dtype`` (computed in fp32)."""
    hs = rows.shape[-1] - INT8_SCALE_BYTES
    scale = rows[..., hs:].contiguous().view(torch.float16).float()
    return (rows[..., :hs].float() * scale).to(dtype)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_size: int,
                       dtype: torch.dtype) -> int:
    """Bytes of K and V that one token occupies across ``num_layers`` layers' caches.

    The memory plan (before loading, from the config) and the engine (after
    loading, from the built model) both size the KV cache with this one formula,
    so the number of blocks the plan promises is the number the engine allocates.
    """
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * num_kv_heads * kv_row_size(head_size, dtype) * elem


@dataclass
class AttentionMetadata:
    """Per-step batch description, built once per step, read by every layer."""

    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    slot_mapping: torch.Tensor      # [num_tokens] int64: cache slot of each new token
    query_start_loc: torch.Tensor   # [num_seqs + 1] int32
    seq_lens: torch.Tensor          # [num_seqs] int32: context length after this step
    block_tables: torch.Tensor      # [num_seqs, max_blocks] int32
    max_query_len: int
    max_seq_len: int
    block_size: int
    # Host copies for backends that loop in Python (avoid .item() syncs per layer).
    query_start_loc_list: list[int] = field(default_factory=list)
    seq_lens_list: list[int] = field(default_factory=list)
    # Backend-specific values computed once per step in build_metadata.
    extras: dict[str, object] = field(default_factory=dict)

    @property
    def num_seqs(self) -> int:
        return self.num_decodes + self.num_prefills


@dataclass(frozen=True)
class AttentionLayerSpec:
    """What a backend needs to know about one attention layer.

    ``sliding_window``: when set, a query at position ``q`` sees only the keys at
    positions ``p`` with ``q - sliding_window < p <= q`` (the window counts the
    query's own token; transformers' ``sliding_window_overlay``), as Gemma 3's
    local layers do. ``logits_soft_cap``: when set, the scaled scores ``s`` become
    ``cap * tanh(s / cap)`` before the mask and the softmax (Gemma 2's
    ``attn_logit_softcapping``). A backend that cannot honour the window or the cap for
    a step must hand that layer to one that can (the reference backend does), never
    ignore it.
    """

    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float
    sliding_window: int | None = None
    logits_soft_cap: float | None = None


class AttentionBackend(ABC):
    """Prefill and decode over a paged KV cache.

    Runs in the engine process (or each worker rank). Owns the KV cache layout:
    the runner allocates each layer's cache with :meth:`kv_cache_shape` once, at
    start-up, and never reallocates it.
    """

    name: str = ""

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int,
                       head_size: int) -> tuple[int, ...]:
        """Shape of one layer's cache; default ``[2, blocks, kv_heads, block, head]``.

        ``head_size`` is the stored row's width, :func:`kv_row_size`: the head size, or
        ``head_size + 2`` for an int8 cache, whose rows end in their fp16 scale."""
        return (2, num_blocks, num_kv_heads, block_size, head_size)

    def build_metadata(self, metadata: AttentionMetadata) -> AttentionMetadata:
        """Add backend-specific, per-step values to ``metadata`` (once per step)."""
        return metadata

    @abstractmethod
    def forward(self, layer: AttentionLayerSpec, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
                ) -> torch.Tensor:
        """Write ``key``/``value`` into the cache at ``slot_mapping`` and attend.

        ``query``: ``[tokens, num_heads, head_size]``; ``key``/``value``:
        ``[tokens, num_kv_heads, head_size]``. Returns ``[tokens, num_heads * head_size]``.
        May modify only ``kv_cache``.
        """

    def copy_blocks(self, kv_caches: list[torch.Tensor], src: torch.Tensor,
                    dst: torch.Tensor) -> None:
        """Copy whole blocks ``src[i] -> dst[i]`` in every layer (copy-on-write forks)."""
        for cache in kv_caches:
            cache[:, dst] = cache[:, src]
