"""Malformed and hostile requests: each a 4xx naming the field, the server healthy after each.

Sent as raw bytes over httpx (so invalid JSON, NaN literals and invalid UTF-8
reach the server as written). After each one ``/health`` must answer 200; at the
end nothing may be left running and every KV block must be free. The ``model``
field gets path-like names pointing into a canary directory watched with inotify:
the server must never open anything there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from reliability_harness import (
    AUTH,
    CHAT,
    CMPL,
    MAX_MODEL_LEN,
    MODEL,
    InotifyWatch,
    healthy,
    kv_idle,
    record,
    wait_for,
)

USER = [{"role": "user", "content": "hi"}]


def _deep(depth: int) -> bytes:
    return b'{"model": "tiny", "prompt": ' + b"[" * depth + b"1" + b"]" * depth + b"}"


#: (what, path, body: dict or raw bytes, expected status, text the error must contain;
#: the field's name wherever there is a field).
BAD: list[tuple[str, str, Any, int, str]] = [
    ("malformed JSON", CMPL, b'{"prompt": "x",', 400, "JSON"),
    ("body is a list", CMPL, b"[1, 2]", 400, "JSON object"),
    ("body is a string", CMPL, b'"hello"', 400, "JSON object"),
    ("empty body", CHAT, b"", 400, "JSON"),
    ("invalid UTF-8", CMPL, b'{"model": "tiny", "prompt": "\xff\xfe\xc3("}', 400, "unicode"),
    ("lone surrogate escape", CMPL, b'{"model": "tiny", "prompt": "\\ud800"}', 400, "JSON"),
    ("NaN temperature", CMPL, b'{"model": "tiny", "prompt": "x", "temperature": NaN}', 400,
     "temperature"),
    ("Infinity top_p", CMPL, b'{"model": "tiny", "prompt": "x", "top_p": Infinity}', 400,
     "top_p"),
    ("overflowing float", CMPL, b'{"model": "tiny", "prompt": "x", "temperature": 1e999}',
     400, "temperature"),
    ("huge integer max_tokens", CMPL, {"prompt": "x", "max_tokens": 2**80}, 400, "max_tokens"),
    ("huge integer seed", CMPL, {"prompt": "x", "seed": 2**100}, 400, "seed"),
    ("negative max_tokens", CMPL, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("max_tokens as a word", CMPL, {"prompt": "x", "max_tokens": "five"}, 400, "max_tokens"),
    ("max_tokens as an object", CMPL, {"prompt": "x", "max_tokens": {"a": 1}}, 400,
     "max_tokens"),
    ("max_tokens fractional", CMPL, {"prompt": "x", "max_tokens": 2.5}, 400, "max_tokens"),
    ("max_tokens past the context", CMPL, {"prompt": "x", "max_tokens": MAX_MODEL_LEN}, 400,
     "max_tokens"),
    ("temperature as a list", CMPL, {"prompt": "x", "temperature": [0.5]}, 400,
     "temperature"),
    ("seed as a word", CMPL, {"prompt": "x", "seed": "abc"}, 400, "seed"),
    ("negative temperature", CMPL, {"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    ("top_p above one", CMPL, {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("top_k below -1", CMPL, {"prompt": "x", "top_k": -7}, 400, "top_k"),
    ("min_p above one", CMPL, {"prompt": "x", "min_p": 3.0}, 400, "min_p"),
    ("repetition_penalty zero", CMPL, {"prompt": "x", "repetition_penalty": 0}, 400,
     "repetition_penalty"),
    ("presence_penalty huge", CMPL, {"prompt": "x", "presence_penalty": 1e6}, 400,
     "presence_penalty"),
    ("n zero", CMPL, {"prompt": "x", "n": 0}, 400, "n"),
    ("n huge", CMPL, {"prompt": "x", "n": 10**9}, 400, "n"),
    ("logprobs negative", CMPL, {"prompt": "x", "logprobs": -3}, 400, "logprobs"),
    ("logprobs too many", CMPL, {"prompt": "x", "logprobs": 10**6}, 400, "logprobs"),
    ("stream not a boolean", CMPL, {"prompt": "x", "stream": "maybe"}, 400, "stream"),
    ("user not a string", CMPL, {"prompt": "x", "user": 5}, 400, "user"),
    ("suffix given", CMPL, {"prompt": "x", "suffix": "abc"}, 400, "suffix"),
    ("prompt is an object", CMPL, {"prompt": {"a": 1}}, 400, "prompt"),
    ("prompt mixes strings and ids", CMPL, {"prompt": ["a", 1]}, 400, "prompt"),
    ("prompt of nested lists too deep", CMPL, {"prompt": [[[1]]]}, 400, "prompt"),
    ("deep JSON nesting", CMPL, _deep(100_000), 400, ""),
    ("token id past the vocabulary", CMPL, {"prompt": [1, 2, 10**6]}, 400, "prompt"),
    ("negative token id", CMPL, {"prompt": [1, -2]}, 400, "prompt"),
    ("token id beyond int64", CMPL, {"prompt": [2**70]}, 400, "prompt"),
    ("token ids past the context", CMPL, {"prompt": [5] * (MAX_MODEL_LEN + 5)}, 400,
     "context"),
    ("text past the context", CMPL, {"prompt": "def f(): pass\n" * 3000}, 400, "prompt"),
    ("megabytes of prompt", CMPL, {"prompt": "a" * 3_000_000}, 400, "prompt"),
    ("body over the limit", CMPL, {"prompt": "b" * 9_000_000}, 413, "limit"),
    ("many prompts past the context", CMPL, {"prompt": ["x " * 4000] * 50}, 400, "prompt"),
    ("stop list of thousands", CMPL, {"prompt": "x", "stop": ["s"] * 5000}, 400, "stop"),
    ("stop string of megabytes", CMPL, {"prompt": "x", "stop": "z" * 1_000_000}, 400, "stop"),
    ("stop of wrong type", CMPL, {"prompt": "x", "stop": 7}, 400, "stop"),
    ("stop list of numbers", CMPL, {"prompt": "x", "stop": [1, 2]}, 400, "stop"),
    ("stop_token_ids negative", CMPL, {"prompt": "x", "stop_token_ids": [-1]}, 400,
     "stop_token_ids"),
    ("null byte model name", CMPL, {"model": "tiny\u0000", "prompt": "x"}, 404, "model"),
    ("model of wrong type", CMPL, {"model": 5, "prompt": "x"}, 400, "model"),
    ("messages empty", CHAT, {"messages": []}, 400, "messages"),
    ("messages not a list", CHAT, {"messages": "hi"}, 400, "messages"),
    ("message without role", CHAT, {"messages": [{"content": "hi"}]}, 400, "role"),
    ("bad role", CHAT, {"messages": [{"role": "root", "content": "hi"}]}, 400, "role"),
    ("image content part", CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}, 400, "image_url"),
    ("chat messages past the context", CHAT,
     {"messages": [{"role": "user", "content": "q" * 200_000}]}, 400, "messages"),
    ("logit_bias outside the vocabulary", CHAT,
     {"messages": USER, "logit_bias": {"99999999": 5}}, 400, "logit_bias"),
    ("logit_bias keyed by words", CMPL, {"prompt": "x", "logit_bias": {"abc": 1}}, 400,
     "logit_bias"),
    ("top_logprobs without logprobs", CHAT, {"messages": USER, "top_logprobs": 3}, 400,
     "top_logprobs"),
    ("chat_template_kwargs overriding tokenize", CHAT,
     {"messages": USER, "chat_template_kwargs": {"tokenize": True}}, 400,
     "chat_template_kwargs"),
    ("tokenize with both prompt and messages", "/tokenize",
     {"prompt": "x", "messages": USER}, 400, "prompt"),
    ("detokenize past the vocabulary", "/detokenize", {"tokens": [10**7]}, 400, "tokens"),
    ("detokenize not a list", "/detokenize", {"tokens": "abc"}, 400, "tokens"),
]

#: ``model`` names that look like paths into the canary directory (filled in per run).
PATH_MODELS = ["{canary}", "{canary}/config.json", "{canary}/../canary/config.json",
               "file://{canary}/config.json", "{canary}/sub", "./{rel}", "../{rel}",
               "~/{rel}", "{canary}\u0000.txt", "{canary}/*"]


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("canary-parent") / "canary"
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (root / "sub" / "tokenizer.json").write_text("{}")
    return root


def _body(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return json.dumps({"model": MODEL, **value} if "model" not in value else value).encode()


def test_hostile_requests_are_4xx_naming_the_field(server: Any, canary: Path) -> None:
    watch = InotifyWatch(canary)
    kinds = 0
    server_errors = []
    failures = []
    cases = list(BAD)
    rel = str(canary).lstrip("/")
    for template in PATH_MODELS:
        name = template.format(canary=canary, rel=rel)
        cases.append((f"path-like model {template}", CMPL, {"model": name, "prompt": "x"},
                      404, "model"))
        cases.append((f"path-like model {template} (chat)", CHAT,
                      {"model": name, "messages": USER}, 404, "model"))
    cases.append(("path-like model card", f"/v1/models/{canary}/config.json", None, 404,
                  "model"))
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as http:
        for what, path, body, status, needle in cases:
            kinds += 1
            if body is None:
                r = http.get(path)
            else:
                r = http.post(path, content=_body(body),
                              headers={"Content-Type": "application/json"})
            if r.status_code >= 500:
                server_errors.append((what, r.status_code, r.text[:200]))
            err = r.json().get("error", {}) if r.headers.get(
                "content-type", "").startswith("application/json") else {}
            named = needle in (err.get("message") or "") or needle == (err.get("param") or "")
            if r.status_code != status or not named:
                failures.append((what, r.status_code, r.text[:300]))
            if not healthy(server):
                failures.append((what, "server unhealthy afterwards", ""))
                break
    opened = watch.events()
    watch.close()
    record("bad_input_kinds", kinds)
    record("bad_input_5xx", len(server_errors))
    assert kinds >= 40
    assert not server_errors, server_errors
    assert not failures, "\n".join(map(repr, failures))
    assert not opened, f"the server opened files a request named: {opened}"
    assert wait_for(lambda: kv_idle(server), 10) is not None


def test_huge_prompts_cost_their_senders(server: Any) -> None:
    """Four 7 MB prompts (under the body limit, far over the context) at once with a
    4-token request, twice: the prompts get their 400 by length without being
    tokenized and the small request is served meanwhile. Figures: the small
    request's latency in each round, the server's RSS before and after each round
    (the second round reuses what the first took: the body limit bounds it)."""
    import threading
    import time

    from reliability_harness import rss_bytes

    huge = json.dumps({"model": MODEL, "prompt": "def f(x): return x\n" * 370_000}).encode()
    rss = [rss_bytes(server.proc.pid)]
    small: list[float] = []
    statuses: list[int] = []

    def send() -> None:
        r = httpx.post(server.url + CMPL, content=huge, headers=AUTH, timeout=120)
        statuses.append(r.status_code)

    for _ in range(2):
        threads = [threading.Thread(target=send) for _ in range(4)]
        for t in threads:
            t.start()
        start = time.perf_counter()
        r = httpx.post(server.url + CMPL, headers=AUTH, timeout=120, json={
            "model": MODEL, "prompt": "ok", "max_tokens": 4, "ignore_eos": True})
        small.append(round(time.perf_counter() - start, 3))
        for t in threads:
            t.join(120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        rss.append(rss_bytes(server.proc.pid))
    record("huge_prompts_small_request_seconds", small)
    record("huge_prompts_rss_mib_before_round1_round2", [round(x / 2**20, 1) for x in rss])
    assert statuses == [400] * 8
    assert healthy(server)
