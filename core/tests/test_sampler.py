"""The sampler on hand-built distributions, against straightforward references."""

from __future__ import annotations

import math

import pytest
import torch
from glowlm.errors import RequestError
from glowlm.sampling.params import SamplingParams
from glowlm.sampling.sampler import (
    SamplingBatch,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    argmax_rows,
    sample,
    seeded_exponential,
)


def _kept(logits: torch.Tensor) -> list[set[int]]:
    return [set(torch.nonzero(torch.isfinite(row)).flatten().tolist()) for row in logits]


def test_top_k_keeps_exactly_k():
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.4, 0.1]]))
    out = apply_top_k_top_p(logits, torch.tensor([2, 1]), None)
    assert _kept(out) == [{1, 3}, {2}]


def test_top_p_keeps_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    # mass before token: 0, .5, .8, .95 -> top_p .8 keeps tokens whose prior mass < .8
    out = apply_top_k_top_p(probs.log(), None, torch.tensor([0.8]))
    assert _kept(out) == [{0, 1}]
    out = apply_top_k_top_p(probs.log(), None, torch.tensor([0.81]))
    assert _kept(out) == [{0, 1, 2}]
    out = apply_top_k_top_p(probs.log(), None, torch.tensor([0.01]))
    assert _kept(out) == [{0}]


def test_top_k_and_top_p_combined_renormalise_after_k():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    # top_k=2 leaves .4/.3 -> renormalised .571/.429; top_p .5 keeps only the first
    out = apply_top_k_top_p(probs.log(), torch.tensor([2]), torch.tensor([0.5]))
    assert _kept(out) == [{0}]


def test_min_p_threshold_is_relative_to_top_token():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = apply_min_p(probs.log(), torch.tensor([0.3]))  # threshold .15
    assert _kept(out) == [{0, 1, 2}]


def _reference_penalties(logits, prompt, output, rep, pres, freq):
    out = logits.clone()
    for t in set(prompt) | set(output):
        out[t] = out[t] / rep if out[t] > 0 else out[t] * rep
    for t in set(output):
        out[t] -= pres + freq * output.count(t)
    return out


def test_penalties_match_reference():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 20, generator=g)
    prompts = [[1, 2, 3], [4]]
    outputs = [[3, 3, 5], [6, 4, 4, 4]]
    b = SamplingBatch(temperature=torch.ones(2), top_k=None, top_p=None, min_p=None,
                      seeded=None, noise_keys=None,
                      presence=torch.tensor([0.5, -0.2]), frequency=torch.tensor([0.3, 1.0]),
                      repetition=torch.tensor([1.3, 0.8]),
                      output_ids=torch.tensor([[3, 3, 5, 20], [6, 4, 4, 4]]),
                      prompt_ids=torch.tensor([[1, 2, 3], [4, 20, 20]]))
    got = apply_penalties(logits, b)
    for i in range(2):
        want = _reference_penalties(logits[i], prompts[i], outputs[i],
                                    [1.3, 0.8][i], [0.5, -0.2][i], [0.3, 1.0][i])
        torch.testing.assert_close(got[i], want)


def test_seeded_noise_depends_only_on_key():
    keys = torch.tensor([11, 12, 11])
    noise = seeded_exponential(keys, 1000)
    assert torch.equal(noise[0], noise[2])
    assert not torch.equal(noise[0], noise[1])
    assert (noise > 0).all()
    # Exp(1): mean 1, and the race picks tokens with the right frequencies.
    assert abs(noise.mean().item() - 1.0) < 0.1


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    n = 4000
    keys = torch.arange(n, dtype=torch.int64) * 7919
    b = SamplingBatch(temperature=torch.ones(n), top_k=None, top_p=None, min_p=None,
                      seeded=torch.ones(n, dtype=torch.bool), noise_keys=keys)
    tokens = sample(probs.log().expand(n, 3).clone(), b).token_ids
    freq = torch.bincount(tokens, minlength=3).float() / n
    assert torch.allclose(freq, probs, atol=0.03)


def test_greedy_rows_take_argmax_and_logprobs_are_raw():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.0, 0.0, 5.0]])
    b = SamplingBatch(temperature=torch.tensor([0.0, 0.0]), top_k=None, top_p=None,
                      min_p=None, seeded=None, noise_keys=None, max_logprobs=2)
    out = sample(logits, b)
    assert out.token_ids.tolist() == [1, 2]
    want = logits.log_softmax(-1)
    torch.testing.assert_close(out.logprobs, want[[0, 1], [1, 2]])
    assert out.ranks.tolist() == [1, 1]
    assert out.top_ids[0].tolist() == [1, 2]


@pytest.mark.parametrize("field,value", [
    ("temperature", -1.0), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("min_p", 2.0),
    ("max_tokens", 0), ("n", 0), ("logprobs", 50), ("presence_penalty", 3.0),
    ("repetition_penalty", 0.0), ("stop", [""]), ("min_tokens", -1),
])
def test_invalid_params_raise_naming_the_field(field, value):
    with pytest.raises(RequestError, match=field.split("_")[0]):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens_is_refused():
    with pytest.raises(RequestError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=2)


def test_logprob_sanity():
    assert math.isclose(sum(torch.tensor([0.2, 0.8]).log().exp().tolist()), 1.0)


def test_argmax_rows_matches_torch_on_ties_nan_and_inf() -> None:
    x = torch.randn(5, 1000, generator=torch.Generator().manual_seed(0))
    x[1, 7] = x[1, 900] = 100.0                    # tie: the first index wins
    x[2, 3] = float("nan")                         # NaN wins, as in torch
    x[3] = float("-inf")                           # all masked: index 0
    x[4, 10:] = float("-inf")
    got = argmax_rows(x)
    assert got.dtype == torch.int64
    assert torch.equal(got, x.argmax(dim=-1))
    assert torch.equal(argmax_rows(x[:, ::2]), x[:, ::2].argmax(dim=-1))  # strided: torch
    assert argmax_rows(x[:0]).shape == (0,)
