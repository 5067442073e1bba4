"""The block-packed GEMM (csrc/cpu/gemm_packed.h) and its measured-choice candidate.

float32 weights run on every kernel build; bfloat16 weights where the build has the
pairwise bf16 dot product (the avx512-bf16 module: AVX512_BF16 CPUs). Elsewhere
``packed_width(torch.bfloat16)`` is 0, the ops refuse bf16 and the candidate does not
take bf16 layers, which is tested too.

The reference is the fp32 product of the same inputs. Every product of two bf16 is exact
in fp32, so the bf16 kernel differs from it only by the order of the fp32 additions and
the one rounding of the output to bf16: within one bf16 ulp (2^-8 relative) of the
output, the summation error being far below it at these K. fp32 differs by the
summation order only: the GEMV's tests' 1e-4 (measured up to 1.5e-6 absolute at K = 2050).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from glowlm import LLM, SamplingParams
from glowlm.testing.tiny_models import make_tiny_model
from glowlm_x86.kernels import ops
from glowlm_x86.kernels.linear import X86LinearMethod, packed_available, packed_candidate
from glowlm_x86.kernels.testing import require_kernels
from torch import nn

TOL = {torch.bfloat16: dict(rtol=2.0 ** -8, atol=1e-5),
       torch.float32: dict(rtol=1e-4, atol=1e-4)}
STEP = {torch.bfloat16: 2, torch.float32: 1}


@pytest.fixture(autouse=True)
def kernels() -> None:
    require_kernels()
    assert packed_available()  # float32 runs on every build


def _width(dtype: torch.dtype) -> int:
    width = ops.packed_width(dtype)
    if width == 0:
        pytest.skip("this kernel build has no pairwise bf16 dot product (needs AVX512_BF16)")
    return width


def _case(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, seed: int = 0
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    return x, w, b, want


@pytest.mark.parametrize("dtype", list(TOL))
def test_pack_layout(dtype: torch.dtype) -> None:
    """Block b, step s, lane r holds row b * W + r's w[S s .. S s + S - 1]; rows past N
    are 0."""
    width, step = _width(dtype), STEP[dtype]
    n, k = 2 * width + 3, 10
    w = torch.arange(n * k, dtype=torch.float32).reshape(n, k).to(dtype)
    p = ops.pack_blocks(w)
    assert p.shape == (3, k // step, width, step) and p.dtype == dtype
    for b in range(3):
        for r in range(width):
            row = b * width + r
            for s in range(k // step):
                want = w[row, step * s:step * s + step].tolist() if row < n else [0.0] * step
                assert p[b, s, r].tolist() == want, (b, s, r)


@pytest.mark.parametrize("dtype", list(TOL))
def test_pack_into_a_given_tensor_equals_pack(dtype: torch.dtype) -> None:
    """pack_blocks_into writes pack_blocks' copy into the caller's tensor (a huge-page
    mapping in the candidate), every element, rows past N included; a wrong out is refused."""
    _width(dtype)
    w = torch.randn(37, 66).to(dtype)
    out = torch.full(ops.packed_shape(w), 7.0, dtype=dtype)
    ops.pack_blocks_into(w, out)
    assert torch.equal(out, ops.pack_blocks(w))
    with pytest.raises(RuntimeError, match="out must be a contiguous"):
        ops.pack_blocks_into(w, torch.empty(out.shape[0] + 1, *out.shape[1:], dtype=dtype))
    with pytest.raises(RuntimeError, match="out must be a contiguous"):
        ops.pack_blocks_into(w, out.float() if dtype != torch.float32 else out.double())
    torch.library.opcheck(torch.ops.glowlm_x86.pack_blocks_into.default, (w, out))


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 33])
@pytest.mark.parametrize("n,k", [(1, 2), (16, 64), (40, 130), (100, 256), (70, 300),
                                 (130, 2050)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_packed_matches_fp32_product(dtype: torch.dtype, m: int, n: int, k: int,
                                          bias: bool) -> None:
    """Token rows through every tile (4, 2, 1) and their mixes; N past whole blocks and
    items of 4 blocks; K across the chunks (64 / 128 k; partial sums kept between them)."""
    _width(dtype)
    x, w, b, want = _case(m, n, k, dtype, bias)
    got = ops.gemm_packed(x, ops.pack_blocks(w), n, b)
    assert got.dtype == dtype and got.shape == (m, n)
    torch.testing.assert_close(got.float(), want, **TOL[dtype])


def test_float32_takes_any_k() -> None:
    x, w, b, want = _case(5, 33, 77, torch.float32, True)
    torch.testing.assert_close(ops.gemm_packed(x, ops.pack_blocks(w), 33, b), want,
                               **TOL[torch.float32])


def test_refuses_what_it_cannot_run() -> None:
    w = torch.randn(8, 6)
    p = ops.pack_blocks(w)
    with pytest.raises(RuntimeError, match="x must be Float"):
        ops.gemm_packed(torch.randn(2, 6).bfloat16(), p, 8, None)
    with pytest.raises(RuntimeError, match="packed must be"):
        ops.gemm_packed(torch.randn(2, 8), p, 8, None)  # another K
    with pytest.raises(RuntimeError, match="packed must be"):
        ops.gemm_packed(torch.randn(2, 6), p, 8 + ops.packed_width(torch.float32), None)
    with pytest.raises(RuntimeError, match="no packed GEMM for Half"):
        ops.pack_blocks(w.half())
    if ops.packed_width(torch.bfloat16):
        with pytest.raises(RuntimeError, match="K even"):
            ops.pack_blocks(torch.randn(8, 5).bfloat16())


@pytest.mark.parametrize("dtype", list(TOL))
def test_opcheck(dtype: torch.dtype) -> None:
    _width(dtype)
    x, w, b, _ = _case(3, 20, 32, dtype, True)
    p = ops.pack_blocks(w)
    torch.library.opcheck(torch.ops.glowlm_x86.pack_blocks.default, (w,))
    torch.library.opcheck(torch.ops.glowlm_x86.gemm_packed.default, (x, p, 20, b))
    torch.library.opcheck(torch.ops.glowlm_x86.gemm_packed.default, (x, p, 20, None))


@pytest.mark.parametrize("dtype", list(TOL))
def test_candidate_keeps_a_copy_it_can_release(dtype: torch.dtype) -> None:
    width = _width(dtype)
    layer = nn.Linear(64, 40, bias=True).to(dtype)
    cand = packed_candidate("test")
    assert cand.supports(layer)
    assert not cand.supports(nn.Linear(64, 8).half())
    assert cand.copy_bytes is not None
    assert cand.copy_bytes(layer) == -(-40 // width) * width * 64 * layer.weight.element_size()
    x = torch.randn(2, 3, 64).to(dtype)
    want = F.linear(x.float(), layer.weight.float(), layer.bias.float())
    got = cand.apply(layer, x, layer.bias)
    assert got.shape == (2, 3, 40) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want, **TOL[dtype])
    assert "packed_weight" in layer.__dict__
    assert cand.release is not None
    cand.release(layer)
    assert "packed_weight" not in layer.__dict__
    names = [c.name for c in X86LinearMethod().linear_candidates(layer)]
    assert names[:2] == ["glowlm", "glowlm-packed"]


def test_bf16_not_taken_without_a_bf16_dot_product() -> None:
    """On the avx2 / avx512 modules bf16 is refused and the candidate skips bf16 layers."""
    if ops.packed_width(torch.bfloat16):
        pytest.skip("this build has the bf16 dot product (the tests above run it)")
    with pytest.raises(RuntimeError, match="no packed GEMM for BFloat16"):
        ops.pack_blocks(torch.randn(16, 8).bfloat16())
    assert not packed_candidate("test").supports(nn.Linear(8, 16).to(torch.bfloat16))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_engine_pinned_to_packed_matches_glowlm_kernels(dtype: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """An engine with every linear on the block-packed GEMM (GLOWLM_LINEAR_IMPL) gives the
    prompt log-probs of the engine on glowlm's own kernels, within bf16's rounding of the
    activations between layers (measured: equal to 4 decimals here) or fp32's order of
    additions."""
    _width(getattr(torch, dtype))
    model = make_tiny_model("llama", tmp_path / "m")
    prompt = torch.randint(3, 384, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    got = {}
    for impl in ("glowlm", "glowlm-packed"):
        monkeypatch.setenv("GLOWLM_LINEAR_IMPL", impl)
        monkeypatch.setenv("GLOWLM_LINEAR_CHOICE_CACHE", str(tmp_path / "cache"))
        llm = LLM(str(model), platform="x86", dtype=dtype, kv_cache_space_gib=0.05,
                  block_size=32, max_model_len=256, show_progress=False)
        out = llm.generate([{"prompt_token_ids": prompt}],
                           SamplingParams(max_tokens=4, prompt_logprobs=0, temperature=0,
                                          ignore_eos=True))[0]
        got[impl] = torch.tensor([out.prompt_logprobs[i][prompt[i]].logprob
                                  for i in range(1, len(prompt))])
        del llm
    bound = 0.1 if dtype == "bfloat16" else 1e-3
    assert float((got["glowlm"] - got["glowlm-packed"]).abs().max()) < bound
