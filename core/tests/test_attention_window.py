"""Sliding-window attention in core's reference backend against attention written out.

Each case fills a paged cache (shuffled blocks) with a sequence's earlier keys and
values, runs one engine-shaped step (decodes first, then prefill chunks) through
the reference backend with ``AttentionLayerSpec.sliding_window``, and compares with
a float64 softmax over exactly the keys transformers' sliding mask allows: a query
at position q sees positions p with q - window < p <= q; with ``logits_soft_cap`` the
scores are capped first (Gemma 2). Tolerance 1e-5: float32
against float64 over at most 100 keys.
"""

from __future__ import annotations

import pytest
import torch
from glowlm.attention.backend import AttentionLayerSpec
from glowlm.attention.reference import ReferenceAttentionBackend
from glowlm.testing.contract import step_metadata

HEADS, KV_HEADS, HEAD = 4, 2, 16
BLOCK = 32


def run_step(backend, steps: list[tuple[int, int]], window: int | None, seed: int = 0,
             dtype: torch.dtype = torch.float32, soft_cap: float | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(backend output, float64 expectation)`` for ``steps`` of ``(query_len, context)``."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-ctx // BLOCK) for _, ctx in steps]
    perm = torch.randperm(sum(need) + 3, generator=g).tolist()
    tables = [[perm.pop() for _ in range(n)] for n in need]
    cache = torch.zeros(2, sum(need) + 3, KV_HEADS, BLOCK, HEAD, dtype=dtype)
    keys = [torch.randn(ctx, KV_HEADS, HEAD, generator=g).to(dtype) for _, ctx in steps]
    values = [torch.randn(ctx, KV_HEADS, HEAD, generator=g).to(dtype) for _, ctx in steps]
    for (qlen, ctx), table, k, v in zip(steps, tables, keys, values, strict=True):
        for pos in range(ctx - qlen):  # the history an earlier step wrote
            cache[0, table[pos // BLOCK], :, pos % BLOCK] = k[pos]
            cache[1, table[pos // BLOCK], :, pos % BLOCK] = v[pos]
    query = torch.randn(sum(q for q, _ in steps), HEADS, HEAD, generator=g).to(dtype)
    new_k = torch.cat([k[ctx - q:] for (q, ctx), k in zip(steps, keys, strict=True)])
    new_v = torch.cat([v[ctx - q:] for (q, ctx), v in zip(steps, values, strict=True)])
    spec = AttentionLayerSpec(HEADS, KV_HEADS, HEAD, 0.3, window, soft_cap)
    meta = backend.build_metadata(step_metadata(steps, tables, BLOCK))
    got = backend.forward(spec, query, new_k, new_v, cache, meta)

    want, row = [], 0
    group = HEADS // KV_HEADS
    for (qlen, ctx), k, v in zip(steps, keys, values, strict=True):
        for j in range(qlen):
            qpos = ctx - qlen + j
            lo = 0 if window is None else max(0, qpos - window + 1)
            kk = k[lo:qpos + 1].double().repeat_interleave(group, dim=1)  # [keys, heads, head]
            vv = v[lo:qpos + 1].double().repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,khd->hk", query[row].double(), kk) * 0.3
            if soft_cap is not None:
                scores = torch.tanh(scores / soft_cap) * soft_cap
            want.append(torch.einsum("hk,khd->hd", scores.softmax(-1), vv).flatten())
            row += 1
    return got, torch.stack(want)


CASES = {
    # decodes below, at and past the window; the longest skips whole blocks
    "decodes": [(1, 5), (1, 12), (1, 13), (1, 40), (1, 100)],
    "whole-prompt": [(50, 50)],
    "chunk-after-prefix": [(16, 80)],  # its first visible key is in the second block
    "mixed": [(1, 70), (1, 9), (20, 20), (16, 64), (3, 3)],
}


@pytest.mark.parametrize("window", [1, 12, 33])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_window_matches_attention_written_out(case: str, window: int) -> None:
    got, want = run_step(ReferenceAttentionBackend(), CASES[case], window)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_a_window_longer_than_every_sequence_changes_nothing() -> None:
    steps = CASES["mixed"]
    windowed, _ = run_step(ReferenceAttentionBackend(), steps, 70)
    full, want = run_step(ReferenceAttentionBackend(), steps, None)
    assert torch.equal(windowed, full)
    torch.testing.assert_close(full.double(), want, atol=1e-5, rtol=1e-5)


def test_window_in_bfloat16() -> None:
    got, want = run_step(ReferenceAttentionBackend(), CASES["mixed"], 12, dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize("window", [None, 12])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_soft_capped_scores(case: str, window: int | None) -> None:
    """Gemma 2's ``logits_soft_cap``: ``cap * tanh(s / cap)`` on the scaled scores, with
    and without a window; a cap of 1 on scores of a few units changes every row."""
    got, want = run_step(ReferenceAttentionBackend(), CASES[case], window, soft_cap=1.0)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    uncapped, _ = run_step(ReferenceAttentionBackend(), CASES[case], window)
    assert not torch.allclose(got, uncapped, atol=1e-3)
