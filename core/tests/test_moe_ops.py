"""Core's mixture-of-experts reference: routing as transformers computes it, and the
grouped expert op against a token-by-token loop (the definition), at fp32 and bf16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from glowlm.ops import reference as ref


def _loop(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
          ids: torch.Tensor) -> torch.Tensor:
    """Every token through each of its experts, one at a time, in float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    inter = w2.shape[2]
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            h = w13[e].double() @ x[t].double()
            act = F.silu(h[:inter]) * h[inter:]
            out[t] += float(weights[t, k]) * (w2[e].double() @ act)
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("tokens", [1, 3, 37])
def test_fused_moe_matches_the_token_loop(dtype: torch.dtype, tol: float, tokens: int) -> None:
    g = torch.Generator().manual_seed(tokens)
    experts, top_k, hidden, inter = 8, 2, 32, 16
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5).to(dtype)
    logits = torch.randn(tokens, experts, generator=g).to(dtype)
    weights, ids = ref.moe_route(logits, top_k, renormalize=True)
    got = ref.fused_moe(x, w13, w2, weights, ids)
    want = _loop(x, w13, w2, weights, ids)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


def test_an_expert_no_token_chose_is_never_read() -> None:
    x = torch.randn(4, 8)
    w13, w2 = torch.randn(3, 8, 8), torch.randn(3, 8, 4)
    w13[1] = float("nan")
    w2[1] = float("nan")
    ids = torch.tensor([[0, 2]] * 4)
    out = ref.fused_moe(x, w13, w2, torch.full((4, 2), 0.5), ids)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("renormalize", [True, False])
def test_routing_is_transformers_arithmetic(renormalize: bool) -> None:
    """Softmax in float32 over the model-dtype logits, top-k, optional renormalization,
    rounded back to the logits' dtype (Qwen3-MoE's / OLMoE's / Mixtral's routers)."""
    logits = torch.randn(5, 16, dtype=torch.bfloat16)
    weights, ids = ref.moe_route(logits, 4, renormalize)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    top, idx = torch.topk(probs, 4, dim=-1)
    if renormalize:
        top /= top.sum(dim=-1, keepdim=True)
    assert torch.equal(ids, idx)
    assert torch.equal(weights, top.to(torch.bfloat16))
