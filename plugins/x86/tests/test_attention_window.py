"""The x86 attention backend with sliding-window layers (Gemma 3's local layers).

The compiled kernel has no window. While every sequence of a step fits inside the
layer's window the window hides nothing and the kernel runs: the output is
bit-identical to the kernel's output for the same layer without a window. A step
with a longer sequence goes to core's reference backend, which masks: the output
is bit-identical to the reference backend's and matches attention written out
(core/tests/test_attention_window.py). Either way the written cache is the
reference's.
"""

from __future__ import annotations

import pytest
import torch
from glowlm.plugin_api import AttentionLayerSpec, AttentionMetadata, ReferenceAttentionBackend
from glowlm.testing.contract import step_metadata
from glowlm_x86.kernels.attention import X86AttentionBackend
from glowlm_x86.kernels.testing import require_kernels, vector_width

HEADS, KV_HEADS, HEAD, BLOCK = 4, 2, 32, 32


@pytest.fixture(autouse=True)
def kernels() -> None:
    require_kernels()


def _run(backend, steps: list[tuple[int, int]], window: int | None,
         dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    need = [-(-ctx // BLOCK) for _, ctx in steps]
    perm = torch.randperm(sum(need) + 2, generator=g).tolist()
    tables = [[perm.pop() for _ in range(n)] for n in need]
    cache = torch.randn(2, sum(need) + 2, KV_HEADS, BLOCK, HEAD, generator=g).to(dtype)
    tokens = sum(q for q, _ in steps)
    q, k, v = (torch.randn(tokens, h, HEAD, generator=g).to(dtype)
               for h in (HEADS, KV_HEADS, KV_HEADS))
    spec = AttentionLayerSpec(HEADS, KV_HEADS, HEAD, HEAD ** -0.5, window)
    meta: AttentionMetadata = backend.build_metadata(step_metadata(steps, tables, BLOCK))
    return backend.forward(spec, q, k, v, cache, meta), cache


SHORT = [(1, 9), (1, 12), (12, 12), (4, 10)]            # every sequence within a 12-token window
LONG = [(1, 9), (1, 70), (20, 20), (16, 64), (3, 3)]    # some sequences past it


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_kernel_runs_while_the_window_hides_nothing(dtype: torch.dtype) -> None:
    x86 = X86AttentionBackend(vector_width())
    windowed, cache_w = _run(x86, SHORT, 12, dtype)
    plain, cache_p = _run(x86, SHORT, None, dtype)
    assert torch.equal(windowed, plain) and torch.equal(cache_w, cache_p)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_longer_sequences_go_to_the_reference_backend(dtype: torch.dtype) -> None:
    x86 = X86AttentionBackend(vector_width())
    got, cache = _run(x86, LONG, 12, dtype)
    want, want_cache = _run(ReferenceAttentionBackend(), LONG, 12, dtype)
    assert torch.equal(got, want) and torch.equal(cache, want_cache)
    unwindowed, _ = _run(x86, LONG, None, dtype)
    assert not torch.allclose(got.float(), unwindowed.float(), atol=0.1)  # the window masked


def test_kernel_covers() -> None:
    spec = AttentionLayerSpec(HEADS, KV_HEADS, HEAD, 1.0, 12)
    short = step_metadata(SHORT, [[0]] * len(SHORT), BLOCK)
    long = step_metadata(LONG, [[0, 1, 2]] * len(LONG), BLOCK)
    assert X86AttentionBackend.kernel_covers(spec, short)
    assert not X86AttentionBackend.kernel_covers(spec, long)
    full = AttentionLayerSpec(HEADS, KV_HEADS, HEAD, 1.0)
    assert X86AttentionBackend.kernel_covers(full, long)
