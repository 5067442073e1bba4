"""The contract's attention check: two engine-shaped steps (prefills, a chunk continuing a
prefix, decodes) through the platform's backend, in its own cache layout, against the
reference backend; and :func:`step_metadata`, the metadata the runner builds for a step
(other attention tests use it too)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from glowlm.attention.backend import AttentionLayerSpec, AttentionMetadata, kv_row_size
from glowlm.attention.reference import ReferenceAttentionBackend
from glowlm.platforms.interface import Platform, dtype_name
from glowlm.testing.contract.common import TOL, close, gen, randn


def step_metadata(steps: Iterable[tuple[int, int]], tables: list[list[int]], block_size: int
                  ) -> AttentionMetadata:
    """The metadata the runner builds for one step.

    ``steps``: ``(query_len, context_len)`` per sequence, decodes (query_len 1) first;
    ``tables``: each sequence's block ids.
    """
    steps = list(steps)
    slots, qsl = [], [0]
    for (qlen, ctx), table in zip(steps, tables, strict=True):
        for pos in range(ctx - qlen, ctx):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        qsl.append(qsl[-1] + qlen)
    width = max(len(t) for t in tables)
    padded = torch.zeros(len(tables), width, dtype=torch.int32)
    for i, t in enumerate(tables):
        padded[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
    lens = [ctx for _, ctx in steps]
    decodes = 0  # leading one-token steps of a sequence already started
    while decodes < len(steps) and steps[decodes][0] == 1 and steps[decodes][1] > 1:
        decodes += 1
    return AttentionMetadata(
        num_decodes=decodes, num_prefills=len(steps) - decodes, num_decode_tokens=decodes,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32), block_tables=padded,
        max_query_len=max(q for q, _ in steps), max_seq_len=max(lens), block_size=block_size,
        query_start_loc_list=qsl, seq_lens_list=lens)


#: Sequences of (prompt length, first-step chunk): A whole, B chunked, C whole, D one token.
_SEQS = {"A": (40, 40), "B": (70, 50), "C": (5, 5), "D": (1, 1)}
_STEP1 = [("A", 40, 40), ("B", 50, 50), ("C", 5, 5), ("D", 1, 1)]  # every one a prefill
_STEP2 = [("A", 1, 41), ("C", 1, 6), ("D", 1, 2), ("B", 20, 70)]   # decodes, then B's rest


def check_attention(platform: Platform, dtype: torch.dtype, heads: int = 8, kv_heads: int = 2,
                    head_size: int = 64, kv_dtype: torch.dtype | None = None) -> None:
    """Two steps through the platform's backend, in its own cache layout, vs the reference;
    the caches in ``kv_dtype`` (default: ``dtype``, as ``--kv-cache-dtype auto``)."""
    block = max(32, platform.capabilities.block_size_multiple)
    backend, ref = platform.attention_backend(), ReferenceAttentionBackend()
    spec = AttentionLayerSpec(heads, kv_heads, head_size, head_size ** -0.5)
    perm = torch.randperm(16, generator=gen(3)).tolist()
    tables = {s: [perm.pop() for _ in range(-(-(n + 4) // block))] for s, (n, _) in _SEQS.items()}
    num_blocks = 16
    caches = {}
    for name, b in (("platform", backend), ("reference", ref)):
        row = kv_row_size(head_size, kv_dtype or dtype)
        caches[name] = torch.zeros(b.kv_cache_shape(num_blocks, block, kv_heads, row),
                                   dtype=kv_dtype or dtype)
    for step_no, step in enumerate((_STEP1, _STEP2)):
        tokens = sum(q for _, q, _ in step)
        q = randn(tokens, heads, head_size, dtype=dtype, seed=10 + step_no)
        k = randn(tokens, kv_heads, head_size, dtype=dtype, seed=20 + step_no)
        v = randn(tokens, kv_heads, head_size, dtype=dtype, seed=30 + step_no)

        def meta(s: list[tuple[str, int, int]] = step) -> AttentionMetadata:
            return step_metadata([(ql, ctx) for _, ql, ctx in s], [tables[n] for n, _, _ in s],
                                 block)

        want = ref.forward(spec, q, k, v, caches["reference"], ref.build_metadata(meta()))
        got = backend.forward(spec, q.clone(), k.clone(), v.clone(), caches["platform"],
                              backend.build_metadata(meta()))
        kv = f", {kv_dtype} cache".replace("torch.", "") if kv_dtype else ""
        close(got, want, TOL[dtype] if dtype != torch.float32 else dict(atol=2e-5, rtol=2e-5),
               f"attention step {step_no + 1} ({dtype_name(dtype)}, {heads}/{kv_heads} heads "
               f"of {head_size}, block {block}{kv})")


def check_attention_fp8(platform: Platform, dtype: torch.dtype) -> None:
    """``--kv-cache-dtype fp8`` and ``fp8_e5m2``: the platform's backend (which may hand
    the layer to the reference) against the reference backend over the same 8-bit
    caches. Both store the rows with the same saturating cast, so they read the same
    values, and each widens them exactly (8-bit floats are bf16, fp16 and fp32 values):
    the tolerance is the activation dtype's."""
    for kv_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        check_attention(platform, dtype, kv_dtype=kv_dtype)


def check_attention_int8(platform: Platform, dtype: torch.dtype) -> None:
    """``--kv-cache-dtype int8``: the platform's backend against the reference over the
    same int8 caches (rows of values and their fp16 scale). Both quantize a row the same
    way (``glowlm.attention.backend.quantize_int8_rows``: the same fp32 division by the
    same rounded scale), so they store the same bytes and read the same values; what
    differs is only the order of the fp32 sums: the tolerance is the activation dtype's."""
    check_attention(platform, dtype, kv_dtype=torch.int8)
