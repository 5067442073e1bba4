"""The pair-packed bf16 GEMM (csrc/cpu/gemm_pairs.h) and its measured-choice candidate.

Runs where the loaded kernel build has the pairwise bf16 dot product (the avx512-bf16
module: AVX512_BF16 CPUs); elsewhere ``pairs_width()`` is 0, the ops refuse and the
candidate is not offered, which is tested too.

The reference is the fp32 product of the same bf16 inputs. Every product of two bf16 is
exact in fp32, so the kernel differs from it only by the order of the fp32 additions and
the one rounding of the output to bf16: within one bf16 ulp (2^-8 relative) of the
output, plus the fp32 summation error, which is far below it at these K.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from glowlm import LLM, SamplingParams
from glowlm.testing.tiny_models import make_tiny_model
from glowlm_x86.kernels import ops
from glowlm_x86.kernels.linear import X86LinearMethod, pairs_available, pairs_candidate
from glowlm_x86.kernels.testing import require_kernels
from torch import nn

BF16_ULP = 2.0 ** -8


@pytest.fixture(autouse=True)
def kernels() -> None:
    require_kernels()


@pytest.fixture()
def width() -> int:
    if not pairs_available():
        pytest.skip("this kernel build has no pairwise bf16 dot product (needs AVX512_BF16)")
    return ops.pairs_width()


def _case(m: int, n: int, k: int, bias: bool, seed: int = 0
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) / k ** 0.5).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    return x, w, b, want


def test_pack_layout(width: int) -> None:
    """Block b, pair p, lane r holds row b * W + r's (w[2p], w[2p + 1]); rows past N are 0."""
    n, k = 2 * width + 3, 10
    w = torch.arange(n * k, dtype=torch.float32).reshape(n, k).bfloat16()
    p = ops.pack_pairs(w)
    assert p.shape == (3, k // 2, width, 2)
    for b in range(3):
        for r in range(width):
            row = b * width + r
            for pair in range(k // 2):
                got = p[b, pair, r].tolist()
                want = w[row, 2 * pair:2 * pair + 2].tolist() if row < n else [0.0, 0.0]
                assert got == want, (b, pair, r)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 33])
@pytest.mark.parametrize("n,k", [(1, 2), (16, 64), (40, 130), (100, 256), (70, 300),
                                 (130, 2050)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_pairs_matches_fp32_product(width: int, m: int, n: int, k: int,
                                         bias: bool) -> None:
    """Token rows through every tile (4, 2, 1) and their mixes; N past whole blocks and
    items of 4 blocks; K across the 128-wide chunks (partial sums kept between them)."""
    x, w, b, want = _case(m, n, k, bias)
    got = ops.gemm_pairs(x, ops.pack_pairs(w), n, b)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    torch.testing.assert_close(got.float(), want, rtol=BF16_ULP, atol=1e-5)


def test_refuses_what_it_cannot_run(width: int) -> None:
    w = torch.randn(8, 6).bfloat16()
    with pytest.raises(RuntimeError, match="K even"):
        ops.pack_pairs(torch.randn(8, 5).bfloat16())
    with pytest.raises(RuntimeError, match="bfloat16"):
        ops.pack_pairs(w.float())
    p = ops.pack_pairs(w)
    with pytest.raises(RuntimeError, match="x must be bfloat16"):
        ops.gemm_pairs(torch.randn(2, 6), p, 8, None)
    with pytest.raises(RuntimeError, match="packed must be"):
        ops.gemm_pairs(torch.randn(2, 8).bfloat16(), p, 8, None)  # another K
    with pytest.raises(RuntimeError, match="packed must be"):
        ops.gemm_pairs(torch.randn(2, 6).bfloat16(), p, 8 + width, None)  # another N


def test_opcheck(width: int) -> None:
    x, w, b, _ = _case(3, 20, 32, True)
    p = ops.pack_pairs(w)
    torch.library.opcheck(torch.ops.glowlm_x86.pack_pairs.default, (w,))
    torch.library.opcheck(torch.ops.glowlm_x86.gemm_pairs.default, (x, p, 20, b))
    torch.library.opcheck(torch.ops.glowlm_x86.gemm_pairs.default, (x, p, 20, None))


def test_candidate_keeps_a_copy_it_can_release(width: int) -> None:
    layer = nn.Linear(64, 40, bias=True).to(torch.bfloat16)
    cand = pairs_candidate("test")
    assert cand.supports(layer)
    assert not cand.supports(nn.Linear(63, 8).to(torch.bfloat16))   # odd K
    assert not cand.supports(nn.Linear(64, 8))                        # float32
    assert cand.copy_bytes is not None and cand.copy_bytes(layer) == -(-40 // width) * width * 128
    x = torch.randn(2, 3, 64).bfloat16()
    want = F.linear(x.float(), layer.weight.float(), layer.bias.float())
    got = cand.apply(layer, x, layer.bias)
    assert got.shape == (2, 3, 40)
    torch.testing.assert_close(got.float(), want, rtol=BF16_ULP, atol=1e-5)
    assert "pairs_weight" in layer.__dict__
    assert cand.release is not None
    cand.release(layer)
    assert "pairs_weight" not in layer.__dict__
    names = [c.name for c in X86LinearMethod().linear_candidates(layer)]
    assert names[:2] == ["glowlm", "glowlm-pairs"]


def test_not_offered_without_a_bf16_dot_product() -> None:
    """On the avx2 / avx512 modules the ops refuse and the method does not list it."""
    if pairs_available():
        pytest.skip("this build has the bf16 dot product (the tests above run it)")
    assert ops.pairs_width() == 0
    with pytest.raises(RuntimeError, match="no bf16 dot product"):
        ops.pack_pairs(torch.randn(16, 8).bfloat16())
    layer = nn.Linear(8, 16).to(torch.bfloat16)
    assert "glowlm-pairs" not in [c.name for c in X86LinearMethod().linear_candidates(layer)]


def test_engine_pinned_to_pairs_matches_glowlm_kernels(width: int, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 engine with every linear on the pair-packed GEMM (GLOWLM_LINEAR_IMPL)
    gives the prompt log-probs of the engine on glowlm's own kernels, within bf16's
    rounding of the activations between layers (measured: equal to 4 decimals here)."""
    model = make_tiny_model("llama", tmp_path / "m")
    prompt = torch.randint(3, 384, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    got = {}
    for impl in ("glowlm", "glowlm-pairs"):
        monkeypatch.setenv("GLOWLM_LINEAR_IMPL", impl)
        monkeypatch.setenv("GLOWLM_LINEAR_CHOICE_CACHE", str(tmp_path / "cache"))
        llm = LLM(str(model), platform="x86", dtype="bfloat16", kv_cache_space_gib=0.05,
                  block_size=32, max_model_len=256, show_progress=False)
        out = llm.generate([{"prompt_token_ids": prompt}],
                           SamplingParams(max_tokens=4, prompt_logprobs=0, temperature=0,
                                          ignore_eos=True))[0]
        got[impl] = torch.tensor([out.prompt_logprobs[i][prompt[i]].logprob
                                  for i in range(1, len(prompt))])
        del llm
    diff = float((got["glowlm"] - got["glowlm-pairs"]).abs().max())
    print(f"max prompt log-prob difference {diff:.4f}")
    assert diff < 0.1
