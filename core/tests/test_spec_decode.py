"""Speculative decoding in the engine: the plain run's tokens, drafted or not.

Tiny random models repeat themselves quickly under greedy decoding, and the prompts
here repeat a pattern, so n-gram drafts get accepted (each test checks that they
did, or it would prove nothing). The plain engine is the reference: greedy and
seeded outputs, log-probabilities, stops and lengths must be identical.
"""

from __future__ import annotations

import math

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.config import EngineConfig, SpeculativeConfig
from glowlm.engine.spec_decode.adaptive import StepCost, plan_draft_lengths
from glowlm.engine.spec_decode.ngram import lookup
from glowlm.errors import ConfigError
from glowlm.testing.tiny_models import SMALL_ENGINE

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
    "adaptive": False,
}


def _prompts(n: int = 5, shared: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(11)
    prefix = torch.randint(3, 384, (shared,), generator=g).tolist()
    out = []
    for i in range(n):
        pattern = torch.randint(3, 384, (3 + i,), generator=g).tolist()
        out.append({"prompt_token_ids": prefix + pattern * (2 + i) + pattern[:1]})
    return out


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    """A plain engine and a speculating one on the same tiny Llama (small token budget,
    so prompt chunks share steps with verifications)."""
    model = str(tiny_model_dir("llama"))
    settings = dict(platform="generic", max_num_batched_tokens=48, **SMALL_ENGINE)
    return LLM(model, **settings), LLM(model, speculative_config=NGRAM, **settings)


def _tokens(outs) -> list[list[int]]:
    return [c.token_ids for o in outs for c in o.outputs]


def test_greedy_identical_in_a_batch_with_chunked_prefill_and_prefix_caching(engines):
    plain, spec = engines
    prompts = _prompts(5) + _prompts(3, shared=70)  # 70 shared tokens: two cached blocks
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, logprobs=2)
    before = spec.engine.speculator.stats.num_accepted_tokens
    want = plain.generate(prompts, params, use_tqdm=False)
    got = spec.generate(prompts, params, use_tqdm=False)
    assert _tokens(got) == _tokens(want)
    assert spec.engine.speculator.stats.num_accepted_tokens - before > 20
    assert sum(o.num_cached_tokens for o in got) >= 2 * 64
    for a, b in zip(want, got, strict=True):  # the target's logprobs, position by position
        for pa, pb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert sorted(pa) == sorted(pb)
            for tid in pa:
                assert pa[tid].logprob == pytest.approx(pb[tid].logprob, abs=1e-4)
    bm = spec.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # every block given back, rejected slots too


def test_seeded_sampling_is_the_plain_runs_and_reproducible(engines):
    plain, spec = engines
    prompts = _prompts(4)
    params = SamplingParams(
        temperature=0.8,
        top_k=40,
        seed=5,
        n=2,
        max_tokens=40,
        ignore_eos=True,
        repetition_penalty=1.1,
    )
    want = _tokens(plain.generate(prompts, params, use_tqdm=False))
    first = _tokens(spec.generate(prompts, params, use_tqdm=False))
    again = _tokens(spec.generate(prompts[::-1], params, use_tqdm=False))[::-1]
    assert first == want
    assert [t for pair in zip(again[1::2], again[::2], strict=True) for t in pair] == want


def test_stops_and_lengths_inside_an_accepted_run(engines):
    plain, spec = engines
    prompts = _prompts(5)
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    reference = _tokens(plain.generate(prompts, greedy, use_tqdm=False))
    for i, prompt in enumerate(prompts):
        stop_token = reference[i][12]
        for params in (
            SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop_token]),
            SamplingParams(temperature=0, max_tokens=7 + i, ignore_eos=True),
            SamplingParams(
                temperature=0,
                max_tokens=40,
                ignore_eos=True,
                stop=[plain.get_tokenizer().decode(reference[i][9:11])],
            ),
        ):
            a = plain.generate(prompt, params, use_tqdm=False)[0].outputs[0]
            b = spec.generate(prompt, params, use_tqdm=False)[0].outputs[0]
            assert (b.token_ids, b.text, b.finish_reason, b.stop_reason) == (
                a.token_ids,
                a.text,
                a.finish_reason,
                a.stop_reason,
            )


def test_blocks_shrink_back_after_rejections(engines):
    _, spec = engines
    engine = spec.engine
    bs = engine.config.block_size
    for i, prompt in enumerate(_prompts(3)):
        engine.add_request(
            f"shrink-{i}", prompt, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
        )
    while engine.has_unfinished_requests():
        engine.step()
        for seq in engine.scheduler.running:
            assert len(seq.block_table) <= math.ceil(seq.num_tokens / bs)


def test_adaptive_speculation_keeps_greedy_output(tiny_model_dir):
    model = str(tiny_model_dir("llama"))
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = _prompts(3)
    plain = LLM(model, platform="generic", **SMALL_ENGINE).generate(prompts, params, use_tqdm=False)
    adaptive = LLM(
        model,
        platform="generic",
        **SMALL_ENGINE,
        speculative_config='{"method": "ngram", "num_speculative_tokens": 3}',
    )
    assert _tokens(adaptive.generate(prompts, params, use_tqdm=False)) == _tokens(plain)
    assert adaptive.engine.speculator.cost.observations > 0


# -- the pieces ----------------------------------------------------------------------


def test_ngram_lookup_takes_the_longest_latest_match_and_continues_a_loop():
    import numpy as np

    t = np.array([1, 2, 3, 9, 2, 3, 7, 8, 1, 2, 3])
    assert lookup(t, 1, 3, 2) == [9, 2]  # "1 2 3" (length 3) beats the later "2 3"
    assert lookup(t, 1, 2, 2) == [7, 8]  # at most 2: the latest "2 3"
    assert lookup(t, 4, 4, 2) == []  # no 4-token repeat
    assert lookup(np.array([5, 6, 5, 6, 5]), 1, 2, 5) == [6, 5, 6, 5, 6]  # period 2
    assert lookup(np.array([4, 4]), 1, 1, 3) == [4, 4, 4]


def test_plan_drafts_nothing_when_acceptance_does_not_pay():
    cheap = StepCost()  # a host where a 5-row step costs 13 % more than a 1-row step
    for _ in range(5):
        cheap.observe(1, False, 0.100)
        cheap.observe(5, True, 0.113)
    assert cheap.predict(3) == pytest.approx(0.1065)  # between measured row counts
    assert plan_draft_lengths([0.9], [4], 1, cheap) == [4]
    assert plan_draft_lengths([0.02], [4], 1, cheap) == [0]
    assert plan_draft_lengths([0.9, 0.01], [4, 4], 2, cheap) == [4, 0]
    # Where a bigger step costs much more (other kernels past two rows), drafting stops.
    dear = StepCost()
    for _ in range(5):
        dear.observe(1, False, 0.010)
        dear.observe(2, True, 0.020)
        dear.observe(5, True, 0.050)
    assert plan_draft_lengths([0.6], [4], 1, dear) == [0]
    assert plan_draft_lengths([0.99], [4], 1, dear) == [0]  # 5 tokens for 5x the time
    # An unmeasured size is tried (optimistically priced), so its cost gets measured.
    fresh = StepCost()
    fresh.observe(1, False, 0.010)
    assert plan_draft_lengths([0.6], [4], 1, fresh) == [4]
    # One slow step (a busy host) moves an estimate by at most OUTLIER x.
    cheap.observe(1, False, 10.0)
    assert cheap.predict(1) < 0.2


@pytest.mark.parametrize(
    "value,message",
    [
        ({"method": "eagle9", "num_speculative_tokens": 2}, "unknown speculative_config method"),
        ({"method": "eagle", "model": "x", "num_speculative_tokens": 2}, "not built"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs model"),
        ({"model": "some/draft"}, "needs num_speculative_tokens"),
        ({"method": "ngram"}, "needs num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "integer >= 1"),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 2,
                "prompt_lookup_min": 5,
                "prompt_lookup_max": 2,
            },
            "prompt_lookup_min (5) must be <=",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3},
            "unknown key(s) lookahead",
        ),
        ({"num_speculative_tokens": 2}, "needs a method"),
        ('{"method": "ngram",', "not valid JSON"),
        ([1, 2], "must be a JSON object"),
        ({"method": "suffix", "suffix_decoding_min_token_prob": 2}, "in [0, 1]"),
    ],
)
def test_config_errors_are_one_clear_line(value, message):
    with pytest.raises(ConfigError, match=None) as err:
        EngineConfig.create("m", speculative_config=value)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_config_takes_vllms_json_and_defaults():
    c = EngineConfig.create(
        "m",
        speculative_config='{"method": "ngram", '
        '"num_speculative_tokens": 4, "prompt_lookup_max": 4}',
    )
    assert c.speculative_config == SpeculativeConfig("ngram", 4, 4, 4)
    assert (
        SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2}).prompt_lookup_min
        == 5
    )  # vLLM's default when neither bound is given
    suffix = SpeculativeConfig.parse({"method": "suffix"})
    assert suffix.num_speculative_tokens == suffix.suffix_decoding_max_tree_depth == 24
    assert EngineConfig.create("m").speculative_config is None


def test_suffix_greedy_identical_and_learns_across_requests(engines, tiny_model_dir):
    plain, _ = engines
    model = str(tiny_model_dir("llama"))
    suffix = LLM(
        model,
        platform="generic",
        max_num_batched_tokens=48,
        **SMALL_ENGINE,
        speculative_config={"method": "suffix", "num_speculative_tokens": 6, "adaptive": False},
    )
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = _prompts(4)
    assert _tokens(suffix.generate(prompts, params, use_tqdm=False)) == _tokens(
        plain.generate(prompts, params, use_tqdm=False)
    )
    stats = suffix.engine.speculator.stats
    assert stats.num_accepted_tokens > 10
    # The same prompt again: its first decode steps find the earlier output in the
    # server-wide cache, so more of its drafts are accepted than the first time.
    first = stats.num_accepted_tokens
    again = suffix.generate(prompts[:1], params, use_tqdm=False)
    assert _tokens(again) == _tokens(plain.generate(prompts[:1], params, use_tqdm=False))
    assert stats.num_accepted_tokens - first >= 30


def test_suffix_continuation_follows_the_most_frequent_branch():
    import numpy as np
    from glowlm.engine.spec_decode.suffix import frequent_continuation

    t = np.array([1, 2, 3, 4, 9, 1, 2, 3, 4, 9, 1, 2, 3, 5, 1, 2, 3])
    draft, score = frequent_continuation(t, t, 24, 5, 1.0, 0.1, limit=len(t) - 1)
    assert draft == [4, 9, 1] and score == pytest.approx(2.0)  # 2/3 each, 3 = match length
    assert frequent_continuation(t, t, 24, 5, 1.0, 0.7, limit=len(t) - 1)[0] == []
