"""The compiled mixture-of-experts op (csrc/cpu/moe.h) against core's reference.

Tokens are grouped by expert and each routed expert runs one GEMV (its tokens up to the
policy's ``gemv_max_m``) or the blocked GEMM, the activation and the weighted sum in
fp32: fp32 results differ from the reference by summation order only; bf16 ones by the
reference's extra roundings (it rounds to bf16 after each step), within the GEMM's bf16
tolerance. Shapes: the benchmark MoE layer (hidden 1024, 64 experts of 256, 8 routed)
at decode, a batch and a prefill chunk; an expert none of the tokens chose is never
read (its weights are NaN here). A model with experts on x86 gives the reference
platform's greedy tokens.
"""

from __future__ import annotations

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.plugin_api import reference_ops as reference
from glowlm.testing.tiny_models import SMALL_ENGINE, VOCAB, make_tiny_model
from glowlm_x86.kernels import ops
from glowlm_x86.kernels.testing import require_kernels

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=1.6e-2)}


@pytest.fixture(autouse=True)
def kernels() -> None:
    require_kernels()


def _layer(tokens: int, dtype: torch.dtype, hidden: int = 1024, inter: int = 256,
           experts: int = 64, top_k: int = 8, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5).to(dtype)
    logits = torch.randn(tokens, experts, generator=g).to(dtype)
    logits[:, 0] = -40.0  # expert 0 is never chosen: its weights must never be read
    w13[0] = float("nan")
    w2[0] = float("nan")
    weights, ids = reference.moe_route(logits, top_k, renormalize=True)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("tokens", [1, 4, 33])
def test_fused_moe_matches_the_reference(dtype: torch.dtype, tokens: int) -> None:
    x, w13, w2, weights, ids = _layer(tokens, dtype)
    want = reference.fused_moe(x, w13, w2, weights, ids)
    got = ops.fused_moe(x, w13, w2, weights, ids, "silu", 8)
    assert got.dtype == dtype and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, **TOL[dtype])


@pytest.mark.parametrize("gemv_max_m", [0, 64])
def test_the_gemv_and_the_gemm_give_one_result(gemv_max_m: int) -> None:
    x, w13, w2, weights, ids = _layer(12, torch.float32, hidden=128, inter=64, experts=8,
                                      top_k=2)
    got = ops.fused_moe(x, w13, w2, weights, ids, "silu", gemv_max_m)
    torch.testing.assert_close(got, reference.fused_moe(x, w13, w2, weights, ids),
                               **TOL[torch.float32])


def test_bad_arguments_are_one_line() -> None:
    x, w13, w2, weights, ids = _layer(2, torch.float32, hidden=64, inter=32, experts=4,
                                      top_k=2)
    with pytest.raises(RuntimeError, match="outside"):
        ops.fused_moe(x, w13, w2, weights, ids + 10, "silu", 8)
    with pytest.raises(RuntimeError, match="w13 must be"):
        ops.fused_moe(x, w13[:, :10], w2, weights, ids, "silu", 8)
    with pytest.raises(RuntimeError, match="activation"):
        ops.fused_moe(x, w13, w2, weights, ids, "relu", 8)


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe"])
def test_a_moe_model_on_x86_gives_the_reference_tokens(tmp_path, arch: str) -> None:  # noqa: ANN001
    model_dir = make_tiny_model(arch, tmp_path / arch)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (3, 30)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)

    def greedy(platform: str) -> list[list[int]]:
        llm = LLM(str(model_dir), platform=platform, **SMALL_ENGINE)
        if platform == "x86":
            assert llm.engine.setup.parts.ops.fused_moe is not reference.fused_moe
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    assert greedy("x86") == greedy("generic")
