"""Engine-level sampling: seeds, n, stop strings, min_tokens, logprobs, streaming text."""

from __future__ import annotations

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.errors import RequestError
from glowlm.testing.tiny_models import SMALL_ENGINE


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir("llama")), platform="generic", max_model_len=256,
               **SMALL_ENGINE)


def _random_prompts(n, seed):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, 60, (n,), generator=g).tolist()
    return [{"prompt_token_ids": torch.randint(3, 384, (k,), generator=g).tolist()} for k in lens]


def test_seeded_sampling_is_batch_independent(llm):
    target = {"prompt_token_ids": [10, 20, 30, 40, 50]}
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=12,
                            ignore_eos=True)
    alone = llm.generate(target, params, use_tqdm=False)[0].outputs[0].token_ids
    for size in (1, 4, 16):
        others = _random_prompts(size - 1, seed=size)
        other_params = [SamplingParams(temperature=1.0, max_tokens=8 + i % 5, ignore_eos=True)
                        for i in range(size - 1)]
        outs = llm.generate(others[: size // 2] + [target] + others[size // 2:],
                            other_params[: size // 2] + [params] + other_params[size // 2:],
                            use_tqdm=False)
        assert outs[size // 2].outputs[0].token_ids == alone


def test_different_seeds_differ(llm):
    target = {"prompt_token_ids": [10, 20, 30]}
    a = llm.generate(target, SamplingParams(temperature=1.0, seed=1, max_tokens=16,
                                            ignore_eos=True), use_tqdm=False)[0]
    b = llm.generate(target, SamplingParams(temperature=1.0, seed=2, max_tokens=16,
                                            ignore_eos=True), use_tqdm=False)[0]
    assert a.outputs[0].token_ids != b.outputs[0].token_ids


def test_n_completions_share_the_prompt(llm):
    prompt = {"prompt_token_ids": list(range(3, 3 + 100))}
    before = llm.engine.stats.prompt_tokens
    out = llm.generate(prompt, SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=10,
                                              ignore_eos=True), use_tqdm=False)[0]
    computed = llm.engine.stats.prompt_tokens - before
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 10 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    assert computed <= 100  # the prompt was computed once, not four times
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_stop_string_spanning_tokens_is_excluded(llm):
    prompt = {"prompt_token_ids": [10, 20, 30, 40]}
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    full = llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0]
    text = full.text
    assert len(text) > 6
    # A stop string made of the end of one token and the start of later ones.
    stop = text[3:7]
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                              stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.find(stop)]
    assert stop not in out.text


def test_stop_token_ids_and_min_tokens(llm):
    prompt = {"prompt_token_ids": [10, 20, 30, 40]}
    full = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    stop_id = full.token_ids[2]
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                              stop_token_ids=[stop_id]),
                       use_tqdm=False)[0].outputs[0]
    first = full.token_ids.index(stop_id)
    assert out.token_ids == full.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    forced = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                 stop_token_ids=[stop_id], min_tokens=8),
                          use_tqdm=False)[0].outputs[0]
    assert len(forced.token_ids) >= 8
    assert stop_id not in forced.token_ids[:7]


def test_logprobs_match_transformers(llm, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    prompt = [10, 20, 30, 40, 50, 60]
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.8, seed=3, max_tokens=6, ignore_eos=True,
                                      logprobs=3), use_tqdm=False)[0].outputs[0]
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama")).eval()
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        ref = hf(ids).logits[0].float().log_softmax(-1)
    for i, token in enumerate(out.token_ids):
        entry = out.logprobs[i]
        want = ref[len(prompt) - 1 + i]
        assert abs(entry[token].logprob - want[token].item()) < 1e-4
        assert len(entry) >= 3
        top3 = want.topk(3).indices.tolist()
        assert set(top3) <= set(entry)


def test_streamed_deltas_concatenate_to_one_shot_decode(llm):
    tok = llm.get_tokenizer()
    prompt = "你好，世界 🌍 café"
    engine = llm.engine
    engine.add_request("stream-1", prompt, SamplingParams(temperature=1.0, seed=5,
                                                          max_tokens=40, ignore_eos=True))
    seen = ""
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            text = out.outputs[0].text
            assert text.startswith(seen)  # deltas only ever append
            seen = text
            if out.finished:
                final = out
    assert final is not None
    assert seen == tok.decode(final.outputs[0].token_ids)


def test_multibyte_prompt_tokens_stream_whole_characters(llm):
    tok = llm.get_tokenizer()
    target = tok.encode("🌍你好🌍café")
    engine = llm.engine
    engine.add_request("stream-2", {"prompt_token_ids": [5]}, SamplingParams(
        temperature=0, max_tokens=1))
    # Feed the multi-byte token sequence through a fresh detokenizer directly.
    from glowlm.engine.detokenizer import IncrementalDetokenizer

    detok = IncrementalDetokenizer(tok, [5])
    deltas = [detok.add(t) for t in target] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(target)
    while engine.has_unfinished_requests():
        engine.step()


def test_invalid_requests_fail_before_queueing(llm):
    engine = llm.engine
    with pytest.raises(RequestError, match="context length"):
        llm.generate({"prompt_token_ids": [5] * 300}, SamplingParams(), use_tqdm=False)
    with pytest.raises(RequestError, match="max_tokens"):
        llm.generate({"prompt_token_ids": [5] * 200}, SamplingParams(max_tokens=100),
                     use_tqdm=False)
    with pytest.raises(RequestError, match="token ids"):
        llm.generate({"prompt_token_ids": [5, 99999]}, SamplingParams(), use_tqdm=False)
    with pytest.raises(RequestError, match="empty"):
        llm.generate({"prompt_token_ids": []}, SamplingParams(), use_tqdm=False)
    assert not engine.has_unfinished_requests()


def test_abort_frees_blocks_at_once(llm):
    engine = llm.engine
    engine.add_request("abort-me", {"prompt_token_ids": list(range(3, 90))},
                       SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.block_manager.num_free_blocks < engine.block_manager.num_blocks
    engine.abort_request("abort-me")
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.has_unfinished_requests()


def test_chat_applies_template(llm):
    out = llm.chat([{"role": "user", "content": "hello"}],
                   SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    tok = llm.get_tokenizer()
    assert tok.decode(out.prompt_token_ids).endswith("# assistant:")
