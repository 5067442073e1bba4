"""Beam search (``LLM.beam_search``, the server's ``use_beam_search``) against transformers.

The reference is transformers' ``generate(num_beams=4, num_return_sequences=4,
do_sample=False, early_stopping="never")`` on the same fp32 tiny Llama. With
``early_stopping="never"`` transformers stops only when no running beam can beat
the worst kept hypothesis (an exact bound), which is glowlm's rule too, so both
searches return the same beams whatever ``length_penalty`` (the default
``early_stopping=False`` guesses the best length and may stop too soon, and
``True`` stops at the first ``num_beams`` finished ones). Both let a hypothesis
finish only from inside the beam and normalise by the generated length with the EOS.

The tiny checkpoint's own EOS never wins a beam (random weights), so a copy of it
ends sequences at token 164, which the model likes: some beams finish early and
``length_penalty`` decides between short and long ones.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from glowlm import LLM, BeamSearchParams, SamplingParams
from glowlm.errors import RequestError
from glowlm.testing.server import ServerProcess, openai_client, post, start_server, stop_server
from glowlm.testing.tiny_models import SMALL_ENGINE

EOS = 164
WIDTH = 4
TOKENS = 12
PROMPTS = [[5, 17, 99, 3, 42, 7, 250, 11] * 5, [300, 12, 8, 77], [9, 8, 7, 6, 5, 4, 3]]
#: Two fp32 implementations of one forward differ by ~1e-6 per log-probability; twelve
#: summed and scaled by len ** 1 (up to 12 ** |length_penalty|) stay well inside this.
SCORE_TOL = dict(rel=1e-5, abs=1e-4)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama whose generation config names token 164 as EOS."""
    out = tmp_path_factory.mktemp("beam") / "llama-eos"
    shutil.copytree(tiny_model_dir("llama"), out)
    gen_file = out / "generation_config.json"
    gen = json.loads(gen_file.read_text())
    gen["eos_token_id"] = EOS
    gen_file.write_text(json.dumps(gen))
    return out


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> LLM:
    return LLM(str(model_dir), platform="generic", max_model_len=256, **SMALL_ENGINE)


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def hf_beams(hf: Any, prompt: list[int], length_penalty: float, eos: int | None
             ) -> tuple[list[list[int]], list[float]]:
    """transformers' four beams (generated tokens up to and with the EOS) and scores."""
    out = hf.generate(torch.tensor([prompt]), num_beams=WIDTH, num_return_sequences=WIDTH,
                      do_sample=False, early_stopping="never", length_penalty=length_penalty,
                      max_new_tokens=TOKENS, output_scores=True, return_dict_in_generate=True,
                      eos_token_id=eos, pad_token_id=1)
    beams = []
    for row in out.sequences:
        ids = row[len(prompt):].tolist()
        beams.append(ids[:ids.index(eos) + 1] if eos is not None and eos in ids else ids)
    return beams, out.sequences_scores.tolist()


def run(llm: LLM, prompts: list[list[int]], **kwargs: Any) -> list[Any]:
    settings = {"beam_width": WIDTH, "max_tokens": TOKENS, **kwargs}
    return llm.beam_search([{"prompt_token_ids": p} for p in prompts],
                           BeamSearchParams(**settings))


@pytest.mark.parametrize("length_penalty", [-1.0, 0.0, 1.0, 2.0])
def test_width_4_is_transformers_beam_search(llm: LLM, hf: Any, length_penalty: float) -> None:
    outs = run(llm, PROMPTS, length_penalty=length_penalty, include_stop_str_in_output=True)
    finishes = set()
    for prompt, out in zip(PROMPTS, outs, strict=True):
        beams, scores = hf_beams(hf, prompt, length_penalty, EOS)
        assert len(out.sequences) == WIDTH
        assert [s.tokens[len(prompt):] for s in out.sequences] == beams
        assert [s.score for s in out.sequences] == pytest.approx(scores, **SCORE_TOL)
        for seq in out.sequences:
            generated = seq.tokens[len(prompt):]
            finishes.add(seq.finish_reason)
            assert seq.tokens[:len(prompt)] == prompt
            assert seq.score == pytest.approx(seq.cum_logprob / len(generated) ** length_penalty)
            # one logprob entry per generated token, the chosen one among its candidates
            assert len(seq.logprobs) == len(generated)
            assert all(len(entry) == 2 * WIDTH for entry in seq.logprobs)
            assert sum(e[t].logprob for e, t in zip(seq.logprobs, generated, strict=True)) == \
                pytest.approx(seq.cum_logprob, abs=1e-5)
            assert seq.text == llm.get_tokenizer().decode(generated, skip_special_tokens=False)
    if length_penalty <= 1.0:  # both endings are exercised (len ** 2 favours long ones)
        assert finishes == {"stop", "length"}


def test_eos_is_left_out_unless_asked_and_ignore_eos_runs_to_max_tokens(llm: LLM,
                                                                         hf: Any) -> None:
    prompt = PROMPTS[1]
    kept, = run(llm, [prompt], length_penalty=0.0, include_stop_str_in_output=True)
    plain, = run(llm, [prompt], length_penalty=0.0)
    stopped = [s for s in plain.sequences if s.finish_reason == "stop"]
    assert stopped and all(s.stop_reason == EOS and EOS not in s.tokens[len(prompt):]
                           for s in stopped)
    assert [s.tokens + ([EOS] if s.stop_reason == EOS else []) for s in plain.sequences] == \
        [s.tokens for s in kept.sequences]
    assert [s.cum_logprob for s in plain.sequences] == [s.cum_logprob for s in kept.sequences]
    ignored, = run(llm, [prompt], length_penalty=0.0, ignore_eos=True)
    beams, scores = hf_beams(hf, prompt, 0.0, None)
    assert [s.tokens[len(prompt):] for s in ignored.sequences] == beams
    assert [s.cum_logprob for s in ignored.sequences] == pytest.approx(scores, **SCORE_TOL)
    assert {s.finish_reason for s in ignored.sequences} == {"length"}
    assert any(EOS in s.tokens[len(prompt):] for s in ignored.sequences)


#: A prompt whose greedy continuation is the EOS at once.
GREEDY_STOP = [300, 12, 8, 77, 97, 97, 164, 97, 292]


def test_width_1_is_greedy(llm: LLM) -> None:
    """With ``length_penalty=0`` (plain sums) one beam is greedy decoding, EOS included;
    with a positive one a longer beam could still beat an early EOS, as in transformers."""
    prompts = [*PROMPTS, GREEDY_STOP]
    greedy = llm.generate([{"prompt_token_ids": p} for p in prompts],
                          SamplingParams(temperature=0, max_tokens=TOKENS, logprobs=0),
                          use_tqdm=False)
    beams = llm.beam_search([{"prompt_token_ids": p} for p in prompts],
                            BeamSearchParams(beam_width=1, max_tokens=TOKENS, length_penalty=0.0,
                                             include_stop_str_in_output=True))
    assert greedy[-1].outputs[0].finish_reason == "stop"
    for prompt, g, b in zip(prompts, greedy, beams, strict=True):
        seq, = b.sequences
        assert seq.tokens[len(prompt):] == g.outputs[0].token_ids
        assert seq.finish_reason == g.outputs[0].finish_reason
        assert seq.cum_logprob == pytest.approx(g.outputs[0].cumulative_logprob, abs=1e-4)


def test_length_penalty_decides_between_short_and_long(llm: LLM) -> None:
    prompt = PROMPTS[1]
    best = {}
    for lp in (-1.0, 0.0, 2.0):
        out, = run(llm, [prompt], length_penalty=lp)
        scores = [s.score for s in out.sequences]
        assert scores == sorted(scores, reverse=True)
        best[lp] = out.sequences[0]
    # A sum of log-probabilities (<= 0) favours the short beam that ended early;
    # dividing by len ** 2 favours the long ones, len ** -1 the short ones even more.
    assert best[0.0].finish_reason == "stop" and best[2.0].finish_reason == "length"
    assert len(best[-1.0].tokens) <= len(best[0.0].tokens) < len(best[2.0].tokens)


def test_temperature_scales_the_scores(llm: LLM, hf: Any) -> None:
    prompt = PROMPTS[2]
    out, = run(llm, [prompt], temperature=2.0, ignore_eos=True, length_penalty=0.0)
    for seq in out.sequences:
        with torch.no_grad():
            logits = hf(torch.tensor([seq.tokens])).logits[0].float()
        logp = torch.log_softmax(logits / 2.0, dim=-1)
        want = sum(logp[i - 1, seq.tokens[i]].item() for i in range(len(prompt), len(seq.tokens)))
        assert seq.cum_logprob == pytest.approx(want, abs=1e-4)


def test_beams_read_the_prefix_cache(model_dir: Path) -> None:
    """Each step re-sends every beam as a prompt: its full KV blocks (the shared 40-token
    prompt's first 32-token block, later the beam's own second one) come from the
    prefix cache, and only the tail after them is computed again."""
    llm = LLM(str(model_dir), platform="generic", max_model_len=256, **SMALL_ENGINE)
    steps, prompt = 30, PROMPTS[0]
    out, = run(llm, [prompt], ignore_eos=True, max_tokens=steps)
    assert all(len(s.tokens) == len(prompt) + steps for s in out.sequences)
    stats = llm.engine.block_manager.stats
    requests = 1 + (steps - 1) * WIDTH  # the first step expands the prompt alone
    sent = len(prompt) + sum(WIDTH * (len(prompt) + s) for s in range(1, steps))
    assert stats.queries == sent
    assert stats.hits >= (requests - 1) * 32
    assert llm.engine.stats.prompt_tokens == sent - stats.hits
    assert stats.hit_rate > 0.5


@pytest.mark.parametrize("kwargs, message", [
    (dict(beam_width=0, max_tokens=4), "beam_width must be an integer >= 1"),
    (dict(beam_width=2, max_tokens=0), "max_tokens must be an integer >= 1"),
    (dict(beam_width=2, max_tokens=4, temperature=-1.0), "temperature must be >= 0"),
    (dict(beam_width=2, max_tokens=4, length_penalty=float("nan")), "length_penalty"),
])
def test_bad_params_are_one_line_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        BeamSearchParams(**kwargs)


def test_bad_requests_are_refused_before_running(llm: LLM) -> None:
    with pytest.raises(RequestError, match="more than the vocabulary"):
        llm.beam_search(PROMPTS[:1], BeamSearchParams(beam_width=300, max_tokens=2))
    with pytest.raises(RequestError, match="does not fit"):
        llm.beam_search([{"prompt_token_ids": PROMPTS[0]}],
                        BeamSearchParams(beam_width=2, max_tokens=250))
    with pytest.raises(RequestError, match="takes BeamSearchParams"):
        llm.beam_search(PROMPTS[:1], SamplingParams())  # type: ignore[arg-type]
    assert not llm.engine.has_unfinished_requests()


def test_text_prompts(llm: LLM) -> None:
    text = "def fibonacci(n):"
    ids = llm.get_tokenizer().encode(text)
    by_text, by_dict, by_ids = (
        llm.beam_search(p, BeamSearchParams(beam_width=2, max_tokens=4))[0]
        for p in (text, {"prompt": text}, {"prompt_token_ids": ids}))
    assert [s.tokens for s in by_text.sequences] == [s.tokens for s in by_dict.sequences] == \
        [s.tokens for s in by_ids.sequences]
    assert by_text.sequences[0].tokens[:len(ids)] == ids


# -- the server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("beam-server") / "server.log"
    srv = start_server(model_dir, log, "--block-size", "32", "--platform", "generic",
                       "--served-model-name", "tiny", "--max-model-len", "256")
    yield srv
    stop_server(srv)


def test_server_completions_return_the_offline_beams(server: ServerProcess, llm: LLM) -> None:
    client = openai_client(server)
    out = client.completions.create(model="tiny", prompt=PROMPTS[1:], n=2, max_tokens=TOKENS,
                                    extra_body={"use_beam_search": True,
                                                "length_penalty": 0.0})
    offline = run(llm, PROMPTS[1:], beam_width=2, length_penalty=0.0)
    assert len(out.choices) == 4
    for p, result in enumerate(offline):
        for j, seq in enumerate(result.sequences):
            choice = out.choices[p * 2 + j]
            assert choice.index == p * 2 + j
            assert choice.text == seq.text
            assert choice.finish_reason == seq.finish_reason
    generated = sum(len(s.tokens) - len(PROMPTS[1 + p]) for p, r in enumerate(offline)
                    for s in r.sequences)
    assert out.usage.completion_tokens == generated


def test_server_chat_returns_the_offline_beams(server: ServerProcess, llm: LLM) -> None:
    messages = [{"role": "user", "content": "def hello(self, name"}]
    out = openai_client(server).chat.completions.create(
        model="tiny", messages=messages, n=2, max_tokens=8,  # type: ignore[arg-type]
        extra_body={"use_beam_search": True})
    tok = llm.get_tokenizer()  # the prompt as the server renders it
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False)
    offline, = llm.beam_search([{"prompt_token_ids": ids}],
                               BeamSearchParams(beam_width=2, max_tokens=8))
    assert [c.message.content for c in out.choices] == [s.text for s in offline.sequences]
    assert [c.index for c in out.choices] == [0, 1]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "def", "stream": True}, "stream"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "stream": True}, "stream"),
    ("/v1/completions", {"prompt": "def", "logprobs": 2}, "logprobs"),
    ("/v1/completions", {"prompt": "def", "n": 0}, "n"),
])
def test_server_refuses_what_beam_search_cannot_do(server: ServerProcess, path: str,
                                                   body: dict[str, Any], param: str) -> None:
    response = post(server, path, {"model": "tiny", "use_beam_search": True, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    if param == "stream":
        assert "does not stream" in error["message"]


def test_server_stream_with_beam_search_is_a_400_for_the_client(server: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError, match="use_beam_search does not stream"):
        openai_client(server).completions.create(
            model="tiny", prompt="def", n=2, stream=True,
            extra_body={"use_beam_search": True})
