"""The x86 attention backend with sliding-window layers (Gemma 3's local layers).

While every sequence of a step fits inside the layer's window the window hides
nothing and the plain kernel runs: the output is bit-identical to the kernel's output
for the same layer without a window. A step with a longer sequence runs the windowed
kernel (``paged_attention_window``): it matches core's reference backend, which masks
and is itself checked against attention written out (core/tests/test_attention_window.py),
within the plain kernel's tolerances against it (fp32 summation order; one output ulp
in bf16), across decodes and prefill chunks that start before, at and past the window,
and over block boundaries. Either way the written cache is the reference's.
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


TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}


@pytest.mark.parametrize("window", [12, 32, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_longer_sequences_run_the_windowed_kernel(dtype: torch.dtype, window: int) -> None:
    x86 = X86AttentionBackend(vector_width())
    got, cache = _run(x86, LONG, window, dtype)
    want, want_cache = _run(ReferenceAttentionBackend(), LONG, window, dtype)
    assert torch.equal(cache, want_cache)
    torch.testing.assert_close(got, want, **TOL[dtype])
    unwindowed, _ = _run(x86, LONG, None, dtype)
    assert not torch.allclose(got.float(), unwindowed.float(), atol=0.1)  # the window masked


def test_windowed_op_with_window_zero_is_the_plain_kernel() -> None:
    from glowlm_x86.kernels import ops

    g = torch.Generator().manual_seed(3)
    steps = [(1, 70), (16, 64)]
    meta = step_metadata(steps, [[0, 1, 2], [3, 4]], BLOCK)
    cache = torch.randn(2, 5, KV_HEADS, BLOCK, HEAD, generator=g)
    q = torch.randn(17, HEADS, HEAD, generator=g)
    args = (q, cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, 0.125)
    assert torch.equal(ops.paged_attention_window(*args, 0), ops.paged_attention(*args))
    with pytest.raises(RuntimeError, match="window must be >= 0"):
        ops.paged_attention_window(*args, -1)


def test_kernel_covers() -> None:
    spec = AttentionLayerSpec(HEADS, KV_HEADS, HEAD, 1.0, 12)
    short = step_metadata(SHORT, [[0]] * len(SHORT), BLOCK)
    long = step_metadata(LONG, [[0, 1, 2]] * len(LONG), BLOCK)
    assert X86AttentionBackend.kernel_covers(spec, short)
    assert not X86AttentionBackend.kernel_covers(spec, long)
    full = AttentionLayerSpec(HEADS, KV_HEADS, HEAD, 1.0)
    assert X86AttentionBackend.kernel_covers(full, long)
