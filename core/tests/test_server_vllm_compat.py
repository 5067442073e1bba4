"""``glowlm serve`` as a drop-in for ``vllm serve``: its flags, lenient parsing, vLLM's
sampling fields and structured outputs, driven by the official openai client (tool
calling: test_server_tool_calling.py).

One server (module scope) is started with a vLLM-style command line; the tiny
random model writes noise, so structured outputs drive it where a shape is
needed, and outputs are validated with ``jsonschema``. A second, short-lived
server checks TLS and ``--root-path``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from glowlm.testing.server import (
    HERMES_TEMPLATE,
    free_port,
    openai_client,
    post,
    start_server,
    stop_server,
)
from glowlm.testing.server import ServerProcess as Server
from glowlm.testing.tiny_models import make_tiny_model

MODEL = "tiny"
EXACT = {"ignore_eos": True}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "admin": {"type": "boolean"}},
    "required": ["name", "age", "admin"], "additionalProperties": False,
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vllm_compat")
    make_tiny_model("llama", root / "llama")
    (root / "hermes.jinja").write_text(HERMES_TEMPLATE)
    gen = root / "gen"
    gen.mkdir()
    (gen / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.0, "max_new_tokens": 7, "top_k": 5}))
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Server]:
    # vLLM's spelling throughout; the log is checked for the warnings below.
    srv = start_server(
        root / "llama", root / "server.log",
        "--tokenizer", str(root / "llama"), "--dtype", "float", "--max-model-len", "1K",
        "--block-size", "32", "--served-model-name", MODEL, "--trust-remote-code",
        "--enable-prefix-caching", "--generation-config", str(root / "gen"),
        "--max-logprobs", "5", "--chat-template", str(root / "hermes.jinja"),
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--allowed-origins", '["http://app.example"]', "--allow-credentials",
        "--uvicorn-log-level", "info", "--shutdown-timeout", "5",
        "--gpu-memory-utilization", "0.9", "--enforce-eager", "--swap-space", "4",
        "--disable-log-requests", "--disable-log-stats")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai_client(server)


# -- flags ---------------------------------------------------------------------------------


def test_vllm_flags_are_accepted_and_ignored_ones_warn_once(server: Server) -> None:
    log = server.log.read_text()
    for flag in ("--gpu-memory-utilization", "--enforce-eager", "--swap-space",
                 "--disable-log-requests"):
        assert log.count(f"{flag} is ignored") == 1, flag
    assert "--trust-remote-code: accepted" in log
    assert "max_model_len 1024" in log  # 1K = 1024
    assert httpx.get(f"{server.url}/v1/models").json()["data"][0]["max_model_len"] == 1024


def test_human_sizes_and_dtype_names() -> None:
    from glowlm.entrypoints.cli.engine_args import dtype_arg, human_int

    assert [human_int(s) for s in ("4096", "4k", "4K", "25.6k", "1m", "1M")] == \
        [4096, 4000, 4096, 25600, 1_000_000, 1 << 20]
    assert [dtype_arg(s) for s in ("half", "float", "bfloat16", "auto")] == \
        ["float16", "float32", "bfloat16", "auto"]
    with pytest.raises(Exception, match="size"):
        human_int("4kb")


def test_cors_preflight_gets_200(server: Server) -> None:
    r = httpx.options(f"{server.url}/v1/chat/completions", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://app.example"
    assert r.headers["access-control-allow-credentials"] == "true"
    other = httpx.options(f"{server.url}/v1/models", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "GET"})
    assert "access-control-allow-origin" not in other.headers


def test_generation_config_defaults_and_request_overrides(client: openai.OpenAI) -> None:
    # The directory's generation_config.json: temperature 0, max_new_tokens 7.
    a = client.chat.completions.create(model=MODEL, messages=USER, extra_body=EXACT)
    b = client.chat.completions.create(model=MODEL, messages=USER, extra_body=EXACT)
    assert a.usage is not None and a.usage.completion_tokens == 7
    assert a.choices[0].message.content == b.choices[0].message.content  # greedy
    c = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3,
                                       extra_body=EXACT)
    assert c.usage is not None and c.usage.completion_tokens == 3
    hot = {client.chat.completions.create(model=MODEL, messages=USER, temperature=1.0,
                                          seed=s, extra_body={**EXACT, "top_k": 0})
           .choices[0].message.content for s in range(4)}
    assert len(hot) > 1  # the request's temperature (and top_k) win


def test_max_logprobs_limits_requests(server: Server) -> None:
    r = post(server, "/v1/completions", {"prompt": "x", "logprobs": 6})
    assert r.status_code == 400 and "max-logprobs" in r.json()["error"]["message"]
    assert post(server, "/v1/completions", {"prompt": "x", "logprobs": 5}).status_code == 200


def test_tls_and_root_path(root: Path) -> None:
    key, cert = root / "key.pem", root / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True,
                   capture_output=True)
    port = free_port()
    env = {**os.environ, "GLOWLM_CPU_KVCACHE_SPACE": "0.05",
           "GLOWLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
           "GLOWLM_DISABLE_KERNELS": "1"}
    log = root / "tls.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "glowlm.entrypoints.cli.main", "serve",
             "--model", str(root / "llama"), "--port", str(port), "--block-size", "32",
             "--served-model-name", MODEL, "--ssl-keyfile", str(key), "--ssl-certfile",
             str(cert), "--root-path", "/api", "--uvicorn-log-level", "warning",
             "--shutdown-timeout", "1"], env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        url = f"https://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", verify=str(cert), timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        # --root-path: a proxy serves the API under /api and strips it; the app builds
        # its own links (the docs page) with the prefix.
        docs = httpx.get(f"{url}/docs", verify=str(cert), timeout=10)
        if docs.status_code == 200:
            assert "/api/openapi.json" in docs.text
        tls = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0,
                            http_client=httpx.Client(verify=str(cert)))
        out = tls.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body=EXACT)
        assert out.usage is not None and out.usage.completion_tokens == 2
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).raise_for_status()
        text = log.read_text()
        assert f"on https://127.0.0.1:{port}/api" in text
        assert "POST /v1/completions" not in text  # --uvicorn-log-level warning: no access log
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- lenient parsing -----------------------------------------------------------------------


def test_lax_values_and_unknown_fields(server: Server) -> None:
    before = server.log.read_text().count("ignored: made_up_field")
    r = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 4.0, "temperature": "0.5",
                                          "made_up_field": {"a": 1}, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4
    time.sleep(0.2)
    assert server.log.read_text().count("ignored: made_up_field") == before + 1
    bad = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2.5})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize("body,field", [
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"structured_outputs": {"regex": "(["}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"logit_bias": {"tok": 1}}, "logit_bias"),
    ({"logit_bias": {"99999": 1}}, "logit_bias"),
    ({"allowed_token_ids": [99999]}, "allowed_token_ids"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "get_weather"}}],
      "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"truncate_prompt_tokens": -5}, "truncate_prompt_tokens"),
])
def test_what_cannot_be_served_is_a_400_naming_the_field(server: Server, body: dict[str, Any],
                                                        field: str) -> None:
    r = post(server, "/v1/chat/completions", {"messages": USER, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert field in (err["param"] or "") or field in err["message"], err


# -- sampling fields -----------------------------------------------------------------------


def test_logit_bias_and_allowed_token_ids(server: Server, client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="def f", max_tokens=5, temperature=1.0,
                                    logit_bias={"65": 100}, logprobs=1, extra_body=EXACT)
    tok = httpx.post(f"{server.url}/detokenize", json={"tokens": [65]}).json()["prompt"]
    assert out.choices[0].text == tok * 5
    allowed = [70, 71, 72]
    out = client.completions.create(model=MODEL, prompt="def f", max_tokens=8, temperature=1.0,
                                    seed=3, logprobs=0,
                                    extra_body={**EXACT, "allowed_token_ids": allowed})
    texts = {httpx.post(f"{server.url}/detokenize", json={"tokens": [t]}).json()["prompt"]
             for t in allowed}
    chosen = out.choices[0].logprobs.tokens  # type: ignore[union-attr]
    assert chosen and set(chosen) <= texts, (chosen, texts)


def test_bad_words_are_never_generated(server: Server, client: openai.OpenAI) -> None:
    args: dict[str, Any] = dict(model=MODEL, prompt="def hello(self", max_tokens=24,
                                temperature=0.0, logprobs=0)
    plain = client.completions.create(**args, extra_body=EXACT).choices[0]
    tokens = plain.logprobs.tokens or []  # type: ignore[union-attr]

    def single_token(text: str) -> bool:
        return text.strip() == text and len(post(server, "/tokenize", {
            "prompt": text, "add_special_tokens": False}).json()["tokens"]) == 1

    words = [t for t in dict.fromkeys(tokens) if t.strip() and single_token(t)][:2]
    if not words:
        pytest.skip("the tiny model produced no single-token word")
    banned = client.completions.create(**args, extra_body={**EXACT, "bad_words": words})
    out_tokens = banned.choices[0].logprobs.tokens or []  # type: ignore[union-attr]
    assert banned.choices[0].text != plain.text
    assert not set(words) & set(out_tokens), (words, out_tokens)


def test_prompt_logprobs_match_echo(server: Server) -> None:
    r = post(server, "/v1/completions", {"prompt": "x = 1 + 2", "max_tokens": 1,
                                          "prompt_logprobs": 2, "logprobs": 0, "echo": True})
    choice = r.json()["choices"][0]
    plp = choice["prompt_logprobs"]
    echoed = choice["logprobs"]["token_logprobs"]
    assert plp[0] is None and len(plp) == r.json()["usage"]["prompt_tokens"]
    ids = post(server, "/tokenize", {"prompt": "x = 1 + 2"}).json()["tokens"]
    for pos in range(1, len(ids)):
        entry = plp[pos]
        assert str(ids[pos]) in entry and 2 <= len(entry) <= 3
        assert entry[str(ids[pos])]["logprob"] == pytest.approx(echoed[pos], abs=1e-5)
    chat = post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 1,
                                                 "prompt_logprobs": 1}).json()
    assert chat["prompt_logprobs"][0] is None
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]


def test_truncate_prompt_tokens(client: openai.OpenAI) -> None:
    long = [5 + i % 300 for i in range(1500)]  # longer than the context: truncation saves it
    out = client.completions.create(model=MODEL, prompt=long, max_tokens=2,
                                    extra_body={**EXACT, "truncate_prompt_tokens": 10})
    assert out.usage is not None and out.usage.prompt_tokens == 10
    whole = client.completions.create(model=MODEL, prompt=long[-10:], max_tokens=4,
                                      temperature=0.0, extra_body=EXACT)
    cut = client.completions.create(model=MODEL, prompt=long, max_tokens=4, temperature=0.0,
                                    extra_body={**EXACT, "truncate_prompt_tokens": 10})
    assert cut.choices[0].text == whole.choices[0].text


def test_processors_batched_with_ordinary_requests(client: openai.OpenAI) -> None:
    """A seeded ordinary request samples the same text alone and beside constrained ones."""
    plain = dict(model=MODEL, prompt="import os", max_tokens=12, temperature=1.0, seed=21,
                 extra_body=EXACT)
    alone = client.completions.create(**plain).choices[0].text  # type: ignore[call-overload]

    async def main() -> list[Any]:
        aclient = openai.AsyncOpenAI(base_url=str(client.base_url), api_key="unused")
        others = [
            aclient.completions.create(model=MODEL, prompt="a", max_tokens=12,
                                       logit_bias={"70": 50}, extra_body=EXACT),
            aclient.completions.create(model=MODEL, prompt="b", max_tokens=100, extra_body={
                "structured_outputs": {"json": PERSON}}),
            aclient.completions.create(model=MODEL, prompt="c", max_tokens=12, extra_body={
                **EXACT, "allowed_token_ids": [5, 6], "bad_words": ["zz"]}),
        ]
        out = await asyncio.gather(aclient.completions.create(**plain), *others)
        await aclient.close()
        return out

    results = asyncio.run(main())
    assert results[0].choices[0].text == alone
    jsonschema.validate(json.loads(results[2].choices[0].text), PERSON)


# -- structured outputs --------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_strict(client: openai.OpenAI, stream: bool) -> None:
    args: dict[str, Any] = dict(
        model=MODEL, messages=USER, max_tokens=60, temperature=1.0, seed=5,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(**args, stream=True) if c.choices)
    else:
        out = client.chat.completions.create(**args)
        assert out.choices[0].finish_reason == "stop"
        text = out.choices[0].message.content or ""
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object(server: Server, client: openai.OpenAI) -> None:
    close = post(server, "/tokenize", {"prompt": "}", "add_special_tokens": False}).json()
    out = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=40, response_format={"type": "json_object"},
        logit_bias={str(close["tokens"][0]): 30})  # the bias makes the object end soon
    assert isinstance(json.loads(out.choices[0].message.content or ""), dict)


def test_structured_outputs_regex_choice_grammar(client: openai.OpenAI) -> None:
    def run(spec: dict[str, Any], seed: int) -> str:
        return client.completions.create(model=MODEL, prompt="x", max_tokens=30,
                                         temperature=1.0, seed=seed,
                                         extra_body={"structured_outputs": spec}).choices[0].text

    import re

    for seed in range(3):
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", run({"regex": r"[0-9]{3}-[a-z]{2}"}, seed))
        assert run({"choice": ["yes", "no", "maybe"]}, seed) in {"yes", "no", "maybe"}
        text = run({"grammar": 'start: "SELECT " col " FROM t"\ncol: "a" | "b" | "c"'}, seed)
        assert re.fullmatch(r"SELECT [abc] FROM t", text), text
    # vLLM's older guided_* names still work.
    old = client.completions.create(model=MODEL, prompt="x", max_tokens=10,
                                    extra_body={"guided_choice": ["left", "right"]})
    assert old.choices[0].text in {"left", "right"}


# -- client commands -----------------------------------------------------------------------


def test_glowlm_chat_and_complete_clients(server: Server) -> None:
    cli = [sys.executable, "-m", "glowlm.entrypoints.cli.main"]
    env = {**os.environ, "GLOWLM_NO_PRELOAD": "1"}
    out = subprocess.run([*cli, "chat", "--url", f"{server.url}/v1", "--max-tokens", "3",
                          "--system-prompt", "be brief", "-q", "hello"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    # Interactive: one answer per line of stdin, the conversation kept.
    out = subprocess.run([*cli, "complete", "--url", f"{server.url}/v1", "--model-name", MODEL,
                          "--max-tokens", "2"], input="def a\nclass B\n", env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("> ") == 3  # two prompts answered, then EOF at the third
    gone = subprocess.run([*cli, "chat", "--url", "http://127.0.0.1:9/v1", "-q", "x"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode == 2 and "no server answers" in gone.stderr


# -- metrics -------------------------------------------------------------------------------


def test_vllm_metric_names_and_prompt_tokens_count_cache_hits(server: Server,
                                                              client: openai.OpenAI) -> None:
    from glowlm.testing.server import scrape_metrics

    prompt = [7 + i % 200 for i in range(70)]  # two full 32-token blocks to reuse
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, extra_body=EXACT)
    before = scrape_metrics(server.url, MODEL)
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, extra_body=EXACT)
    after = scrape_metrics(server.url, MODEL)
    for prefix in ("vllm", "glowlm"):
        assert after[f"{prefix}:prompt_tokens_total"] - before[f"{prefix}:prompt_tokens_total"] \
            == 70  # every prompt token, the 64 cached ones included
        assert after[f"{prefix}:prefix_cache_hits_total"] \
            - before[f"{prefix}:prefix_cache_hits_total"] == 64
        assert after[f"{prefix}:generation_tokens_total"] \
            - before[f"{prefix}:generation_tokens_total"] == 3
        for hist in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                     "e2e_request_latency_seconds", "request_queue_time_seconds",
                     "request_prefill_time_seconds", "request_decode_time_seconds",
                     "request_inference_time_seconds", "time_per_output_token_seconds"):
            assert after[f"{prefix}:{hist}_count"] > before[f"{prefix}:{hist}_count"], hist
        assert after[f"{prefix}:request_prompt_tokens_sum"] \
            - before[f"{prefix}:request_prompt_tokens_sum"] == 70
        for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
            assert f"{prefix}:{gauge}" in after
        assert after[f'{prefix}:request_success_total{{finished_reason="length"}}'] \
            > before[f'{prefix}:request_success_total{{finished_reason="length"}}']
    computed = after["glowlm:prompt_tokens_computed_total"] \
        - before["glowlm:prompt_tokens_computed_total"]
    assert computed == 70 - 64
    assert after["process_cpu_seconds_total"] > 0 and after["process_resident_memory_bytes"] > 0


def test_periodic_throughput_log_line() -> None:
    from glowlm.entrypoints.openai.metrics import EngineSnapshot, ServerMetrics

    m = ServerMetrics("m")
    snap = EngineSnapshot(num_running=2, num_waiting=1, num_unfinished=3,
                          generation_tokens=500, kv_cache_usage=0.25)
    m.snapshot_source = lambda: snap
    start = m._last_log
    m.observe({"prompt_tokens": [100, 100]})
    assert m.maybe_log(start + 1) is None  # not yet 10 s
    line = m.maybe_log(start + 10)
    assert line is not None and line.startswith(
        "Avg prompt throughput: 20.0 tokens/s, Avg generation throughput: 50.0 tokens/s, "
        "Running: 2 reqs, Waiting: 1 reqs, KV cache usage: 25.0%")
    snap = EngineSnapshot(generation_tokens=500)
    assert m.maybe_log(start + 20) is None  # idle: no line
