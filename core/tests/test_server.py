"""The OpenAI-compatible server, driven by the official openai client (sync and async).

One real ``glowlm serve`` subprocess on a tiny seeded Llama serves the whole
module: starting it costs seconds on a shared 2-core machine, requests cost
milliseconds. Output of the tiny model is noise, so tests compare the server
with itself (streamed vs not, same seed twice) and count tokens exactly with
``ignore_eos``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest
from glowlm.testing.server import ServerProcess as Server
from glowlm.testing.server import scrape_metrics, start_server, stop_server
from glowlm.testing.tiny_models import make_tiny_model

MODEL = "tiny"
EXACT = {"ignore_eos": True}
#: Served with --chat-template, so the flag is what the chat tests exercise.
TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("server")
    model = make_tiny_model("llama", root / "llama")
    (root / "template.jinja").write_text(TEMPLATE)
    srv = start_server(model, root / "server.log", "--block-size", "32",
                       "--served-model-name", MODEL, "--chat-template",
                       str(root / "template.jinja"))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def metrics(server: Server) -> dict[str, float]:
    return scrape_metrics(server.url, MODEL)


def test_models_health_version(server: Server, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/version").json()["version"]


def test_completion_usage_is_exact(server: Server, client: openai.OpenAI) -> None:
    prompt = "def fibonacci(n):"
    count = httpx.post(f"{server.url}/tokenize", json={"prompt": prompt}).json()["count"]
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=9, extra_body=EXACT)
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (count, 9)
    assert out.usage.total_tokens == count + 9
    assert out.choices[0].finish_reason == "length"


def test_stream_equals_non_stream_for_same_seed(client: openai.OpenAI) -> None:
    args = dict(model=MODEL, prompt="class Greeter:", max_tokens=12, temperature=1.0, seed=7,
                extra_body=EXACT)
    whole = client.completions.create(**args)  # type: ignore[call-overload]
    chunks = list(client.completions.create(
        **args, stream=True, stream_options={"include_usage": True}))  # type: ignore[call-overload]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_stream_never_splits_a_character(client: openai.OpenAI, seed: int) -> None:
    """Byte-level BPE pieces are often half a character: deltas must wait for the rest."""
    args = dict(model=MODEL, prompt="你好，世界 🌍 café", max_tokens=24, temperature=1.0,
                seed=seed, extra_body=EXACT)
    whole = client.completions.create(**args).choices[0].text  # type: ignore[call-overload]
    pieces = [c.choices[0].text for c in client.completions.create(
        **args, stream=True)]  # type: ignore[call-overload]
    assert "".join(pieces) == whole
    assert all(p.encode("utf-8").decode("utf-8") == p for p in pieces)
    assert "\ufffd" not in "".join(pieces) or "\ufffd" in whole  # no premature U+FFFD


def test_same_seed_same_text_and_n(client: openai.OpenAI) -> None:
    def sample(seed: int) -> list[str]:
        out = client.completions.create(model=MODEL, prompt="def hello", max_tokens=10, n=2,
                                        temperature=1.0, seed=seed, extra_body=EXACT)
        assert sorted(c.index for c in out.choices) == [0, 1]
        assert out.usage is not None and out.usage.completion_tokens == 20
        return [c.text for c in sorted(out.choices, key=lambda c: c.index)]

    assert sample(11) == sample(11)
    assert sample(11) != sample(12)


def test_prompt_lists_and_token_ids(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt=["a = 1", "b = 2"], n=2, max_tokens=3,
                                    extra_body=EXACT)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    out = client.completions.create(model=MODEL, prompt=[[5, 6, 7], [8, 9]], max_tokens=2,
                                    extra_body=EXACT)
    assert out.usage is not None and out.usage.prompt_tokens == 5
    assert out.usage.completion_tokens == 4


def _stop_string(text: str) -> tuple[str, int]:
    """A two-character ASCII piece of ``text`` first seen at index >= 2."""
    for i in range(2, len(text) - 1):
        piece = text[i:i + 2]
        if piece.isascii() and piece.isprintable() and text.find(piece) == i:
            return piece, i
    pytest.skip("the tiny model produced no usable stop string")


def test_stop_strings_end_text_and_never_leak(client: openai.OpenAI) -> None:
    args = dict(model=MODEL, prompt="def hello(self", max_tokens=40, temperature=0.0,
                extra_body=EXACT)
    full = client.completions.create(**args).choices[0].text  # type: ignore[call-overload]
    stop, at = _stop_string(full)
    out = client.completions.create(**args, stop=[stop])  # type: ignore[call-overload]
    assert out.choices[0].text == full[:at]
    assert out.choices[0].finish_reason == "stop"
    pieces = [c.choices[0].text for c in client.completions.create(
        **args, stop=stop, stream=True)]  # type: ignore[call-overload]
    assert "".join(pieces) == full[:at]
    assert not any(stop in p for p in pieces)


def test_completion_logprobs_and_echo(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="x = 1", max_tokens=5, logprobs=3,
                                    extra_body=EXACT)
    lp = out.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.top_logprobs is not None
    assert len(lp.tokens) == 5 and len(lp.top_logprobs) == 5
    assert all(v is not None and v <= 0 for v in lp.token_logprobs or [])
    assert all(1 <= len(t) <= 4 for t in lp.top_logprobs if t is not None)
    echo = client.completions.create(model=MODEL, prompt="x = 1", max_tokens=2, logprobs=1,
                                     echo=True, extra_body=EXACT)
    assert echo.choices[0].text.startswith("x = 1")
    elp = echo.choices[0].logprobs
    assert elp is not None and elp.token_logprobs is not None
    assert elp.token_logprobs[0] is None  # the first prompt token has no logprob
    assert echo.usage is not None
    assert len(elp.token_logprobs) == echo.usage.prompt_tokens + 2


def test_chat_stream_equals_non_stream(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    args = dict(model=MODEL, messages=messages, max_completion_tokens=8, temperature=1.0,
                seed=3, extra_body=EXACT)
    whole = client.chat.completions.create(**args)  # type: ignore[call-overload]
    assert whole.usage is not None and whole.usage.completion_tokens == 8
    assert whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(**args, stream=True))  # type: ignore
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_logprobs(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4,
        logprobs=True, top_logprobs=2, extra_body=EXACT)
    content = out.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 4
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)


def test_async_client_concurrent_requests(client: openai.OpenAI) -> None:
    async def main() -> None:
        aclient = openai.AsyncOpenAI(base_url=str(client.base_url), api_key="unused")
        same = [aclient.completions.create(model=MODEL, prompt="import os", max_tokens=6,
                                           seed=5, extra_body=EXACT) for _ in range(2)]
        other = aclient.completions.create(model=MODEL, prompt="for i in", max_tokens=6,
                                           extra_body=EXACT)
        stream = await aclient.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hey"}], max_tokens=5,
            stream=True, extra_body=EXACT)
        a, b, c = await asyncio.gather(*same, other)
        streamed = [chunk async for chunk in stream]
        assert a.choices[0].text == b.choices[0].text
        assert c.usage is not None and c.usage.completion_tokens == 6
        assert streamed[-1].choices[0].finish_reason == "length"
        await aclient.close()

    asyncio.run(main())


def test_tokenize_detokenize(server: Server, client: openai.OpenAI) -> None:
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": "def f(): pass"}).json()
    assert ids["count"] == len(ids["tokens"]) and ids["max_model_len"] == 1024
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": ids["tokens"]}).json()
    assert text["prompt"] == "def f(): pass"

def test_chat_template_file_is_used(server: Server, client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hi"}]
    counted = httpx.post(f"{server.url}/tokenize", json={"messages": messages}).json()
    rendered = httpx.post(f"{server.url}/tokenize", json={
        "prompt": "[user] hi\n[assistant] ", "add_special_tokens": False}).json()
    assert counted["tokens"] == rendered["tokens"]
    chat = client.chat.completions.create(model=MODEL, messages=messages,  # type: ignore
                                          max_tokens=1)
    assert chat.usage is not None and chat.usage.prompt_tokens == counted["count"]


def test_metrics_report_the_engine(server: Server, client: openai.OpenAI) -> None:
    before = metrics(server)
    client.completions.create(model=MODEL, prompt="def a(): return 1", max_tokens=4,
                              extra_body=EXACT)
    after = metrics(server)
    assert after["glowlm:generation_tokens_total"] >= before["glowlm:generation_tokens_total"] + 4
    assert after["glowlm:prompt_tokens_total"] > before["glowlm:prompt_tokens_total"]
    assert after["glowlm:time_to_first_token_seconds_count"] > 0
    assert after["glowlm:inter_token_latency_seconds_count"] > 0
    assert after["glowlm:e2e_request_latency_seconds_count"] > 0
    for name in ("glowlm:num_requests_running", "glowlm:num_requests_waiting",
                 "glowlm:kv_cache_usage_perc", "glowlm:prefix_cache_hit_rate"):
        assert name in after
    assert after["glowlm:num_requests_running"] == 0
    assert after["glowlm:kv_cache_usage_perc"] == 0.0
