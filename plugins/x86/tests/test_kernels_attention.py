"""Compiled paged attention and KV writes against core's reference backend.

Each case builds a random cache with shuffled block tables, then runs the same
step (decodes first, then prefill chunks, as the runner lays them out) through
the x86 backend and the reference backend on separate copies of the cache.
The written caches must be identical; outputs agree within fp32 summation
order (2e-5) for float32, and within one output ulp for bf16/fp16 (the kernel
keeps scores and the softmax in fp32 and rounds once).
"""

from __future__ import annotations

import pytest
import torch
from glowlm.plugin_api import AttentionLayerSpec, AttentionMetadata, ReferenceAttentionBackend
from glowlm_x86.kernels import ops
from glowlm_x86.kernels.attention import X86AttentionBackend
from glowlm_x86.kernels.testing import require_kernels, vector_width

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5),
       torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}


@pytest.fixture(autouse=True)
def kernels() -> None:
    require_kernels()


def _metadata(steps: list[tuple[int, int]], block_size: int, num_blocks: int,
              gen: torch.Generator) -> AttentionMetadata:
    """``steps``: ``(query_len, context_len)`` per sequence, decodes (query_len 1) first."""
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, slots, qsl = [], [], [0]
    for qlen, ctx in steps:
        nblocks = -(-ctx // block_size)
        table = [perm.pop() for _ in range(nblocks)]
        tables.append(table)
        for pos in range(ctx - qlen, ctx):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        qsl.append(qsl[-1] + qlen)
    width = max(len(t) for t in tables)
    padded = torch.zeros(len(tables), width, dtype=torch.int32)
    for i, t in enumerate(tables):
        padded[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
    lens = [ctx for _, ctx in steps]
    num_decodes = sum(1 for q, _ in steps if q == 1)
    return AttentionMetadata(
        num_decodes=num_decodes, num_prefills=len(steps) - num_decodes,
        num_decode_tokens=num_decodes, slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32), block_tables=padded,
        max_query_len=max(q for q, _ in steps), max_seq_len=max(lens), block_size=block_size,
        query_start_loc_list=qsl, seq_lens_list=lens)


def _run(steps: list[tuple[int, int]], heads: int, kv_heads: int, head_size: int,
         block_size: int, dtype: torch.dtype, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-ctx // block_size) for _, ctx in steps) + 3
    cache = torch.randn(2, num_blocks, kv_heads, block_size, head_size, generator=gen).to(dtype)
    tokens = sum(q for q, _ in steps)
    q = torch.randn(tokens, heads, head_size, generator=gen).to(dtype)
    k = torch.randn(tokens, kv_heads, head_size, generator=gen).to(dtype)
    v = torch.randn(tokens, kv_heads, head_size, generator=gen).to(dtype)
    layer = AttentionLayerSpec(heads, kv_heads, head_size, head_size ** -0.5)
    ref_backend, x86_backend = ReferenceAttentionBackend(), X86AttentionBackend(vector_width())
    assert x86_backend.supports(head_size, block_size, dtype)
    ref_cache, x86_cache = cache.clone(), cache.clone()

    def meta() -> AttentionMetadata:  # same shuffled block tables for both backends
        return _metadata(steps, block_size, num_blocks, torch.Generator().manual_seed(seed + 1))

    want = ref_backend.forward(layer, q, k, v, ref_cache, ref_backend.build_metadata(meta()))
    got = x86_backend.forward(layer, q, k, v, x86_cache, x86_backend.build_metadata(meta()))
    assert torch.equal(x86_cache, ref_cache)
    torch.testing.assert_close(got, want, **TOL[dtype])


MIXED = [(1, 1), (1, 33), (1, 70), (5, 5), (20, 47), (40, 40)]  # decodes, then prefills


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("head_size", [64, 80, 96, 128])
def test_mixed_step_matches_reference(dtype: torch.dtype, heads: int, kv_heads: int,
                                      head_size: int) -> None:
    _run(MIXED, heads, kv_heads, head_size, 32, dtype)


@pytest.mark.parametrize("block_size", [32, 64])
@pytest.mark.parametrize("steps", [[(1, 1)], [(1, 31), (1, 32), (1, 33), (1, 200)],
                                   [(37, 37)], [(17, 100)], [(1, 64), (64, 129)]],
                         ids=["first-token", "decode-block-edges", "prefill-odd",
                              "chunk-continues-prefix", "decode-and-chunk"])
def test_lengths_and_blocks(block_size: int, steps: list[tuple[int, int]]) -> None:
    _run(steps, 8, 2, 64, block_size, torch.float32)


def test_generic_head_size_path() -> None:
    w = vector_width()
    _run(MIXED, 4, 2, 3 * w, 32, torch.float32)  # not one of the unrolled sizes


def test_head_size_the_kernel_lacks_uses_the_reference() -> None:
    backend = X86AttentionBackend(vector_width())
    assert not backend.supports(36, 32, torch.float32)
    gen = torch.Generator().manual_seed(0)
    meta = _metadata([(1, 9), (4, 4)], 32, 4, gen)
    cache = torch.zeros(2, 4, 2, 32, 36)
    q, kv = torch.randn(5, 4, 36), torch.randn(5, 2, 36)
    ref_cache = cache.clone()
    ref = ReferenceAttentionBackend()
    layer = AttentionLayerSpec(4, 2, 36, 1 / 6)
    want = ref.forward(layer, q, kv, kv, ref_cache, ref.build_metadata(
        _metadata([(1, 9), (4, 4)], 32, 4, torch.Generator().manual_seed(0))))
    got = backend.forward(layer, q, kv, kv, cache, backend.build_metadata(meta))
    torch.testing.assert_close(got, want)


def test_opcheck() -> None:
    gen = torch.Generator().manual_seed(0)
    meta = _metadata([(1, 9), (4, 4)], 32, 4, gen)
    cache = torch.randn(2, 4, 2, 32, 64, generator=gen)
    q, k = torch.randn(5, 4, 64, generator=gen), torch.randn(5, 2, 64, generator=gen)
    torch.library.opcheck(torch.ops.glowlm_x86.write_kv.default,
                          (cache, k, k, meta.slot_mapping))
    torch.library.opcheck(torch.ops.glowlm_x86.paged_attention.default,
                          (q, cache, meta.block_tables, meta.query_start_loc, meta.seq_lens,
                           0.125))
    ops.write_kv(cache, k, k, meta.slot_mapping)  # the wrapper returns nothing
