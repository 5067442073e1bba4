"""The verifier's acceptance rule against the target distribution (engine/spec_decode/verify.py).

For a deterministic draft ``x`` (what n-gram and suffix proposals are), speculative
sampling must accept ``x`` with probability ``p(x)`` and, on rejection, emit a token
from the residual ``p`` without ``x``, renormalised; overall the emitted token follows
``p`` exactly. Each test draws 40 000 verifications of one draft on an 8-token
vocabulary with fixed seeds, and compares the counts with a chi-square test (and the
acceptance with a binomial z-test) at a false-alarm level of 1e-4: with fixed seeds
the outcome is deterministic, and a wrong rule (accepting with q, resampling from p
instead of the residual, a biased residual) is off by far more than that level allows.
"""

from __future__ import annotations

import math

import pytest
import torch
from glowlm.engine.spec_decode.verify import num_accepted
from glowlm.sampling.sampler import SamplingBatch, noise_key, sample

VOCAB = 8
TRIALS = 40_000
#: chi-square 1 - 1e-4 quantiles (scipy.stats.chi2.ppf) for df = categories - 1.
CHI2_CRIT = {6: 27.856, 7: 29.878}
Z_CRIT = 3.89  # two-sided normal at 1e-4


def _target(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    scaled = logits / temperature
    if top_k:
        kth = scaled.topk(top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return scaled.softmax(-1)


def _verify_many(
    logits: torch.Tensor, draft: int, temperature: float, top_k: int, seeded: bool
) -> torch.Tensor:
    """The target's token at the first drafted position for TRIALS independent rounds."""
    rows = logits.expand(TRIALS, VOCAB).contiguous()
    keys = torch.tensor([noise_key(seed, 0, 7) for seed in range(TRIALS)], dtype=torch.int64)
    batch = SamplingBatch(
        temperature=torch.full((TRIALS,), temperature),
        top_k=torch.full((TRIALS,), top_k, dtype=torch.int64) if top_k else None,
        top_p=None,
        min_p=None,
        seeded=torch.full((TRIALS,), seeded),
        noise_keys=keys,
        greedy=False,
    )
    if not seeded:
        torch.manual_seed(1234)
    return sample(rows, batch).token_ids


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


@pytest.mark.parametrize(
    "temperature,top_k,seeded", [(1.0, 0, True), (0.7, 0, False), (1.3, 5, True)]
)
def test_acceptance_and_residual_follow_the_target(temperature, top_k, seeded):
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(VOCAB, generator=g) * 1.5
    p = _target(logits, temperature, top_k)
    draft = int(p.argsort()[-2])  # a plausible but not the likeliest token
    tokens = _verify_many(logits, draft, temperature, top_k, seeded)
    accepted = [num_accepted([draft], [t, 0]) for t in tokens.tolist()]
    n_acc = sum(accepted)
    # Accepted with probability p(x):
    px = float(p[draft])
    z = (n_acc - TRIALS * px) / math.sqrt(TRIALS * px * (1 - px))
    assert abs(z) < Z_CRIT, (n_acc / TRIALS, px)
    # Rejected: distributed as the residual, p without x, renormalised.
    rejected = tokens[torch.tensor(accepted) == 0]
    residual = p.clone()
    residual[draft] = 0
    residual /= residual.sum()
    counts = torch.bincount(rejected, minlength=VOCAB).float()
    assert counts[draft] == 0
    support = int((residual > 0).sum())
    assert _chi2(counts, residual) < CHI2_CRIT.get(support - 1, 29.878)
    # Overall: the emitted token follows p exactly.
    overall = torch.bincount(tokens, minlength=VOCAB).float()
    assert _chi2(overall, p) < CHI2_CRIT.get(int((p > 0).sum()) - 1, 29.878)


def test_greedy_accepts_exactly_the_argmax():
    logits = torch.tensor([[0.1, 2.0, 0.3, 1.9]] * 2)
    batch = SamplingBatch(torch.zeros(2), None, None, None, None, None, greedy=True)
    t = sample(logits, batch).token_ids.tolist()
    assert num_accepted([1, 3], t + [0]) == 1  # t = [1, 1]: the first draft, then a mismatch
    assert num_accepted([1, 1], [1, 1, 2]) == 2
    assert num_accepted([3], [1, 0]) == 0
