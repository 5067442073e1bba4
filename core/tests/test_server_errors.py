"""Failure behaviour: bad input is a 4xx naming the field, and nothing is ever left running.

The server here requires an API key and runs one sequence at a time with a
queue of one (``--max-num-seqs 1 --max-queue 1``), so a single long request
fills it: that makes the full-queue 503 and the disconnect abort observable.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from glowlm.testing.server import ServerProcess as Server
from glowlm.testing.server import scrape_metrics, start_server, stop_server
from glowlm.testing.tiny_models import make_tiny_model

MODEL = "tiny"
KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = {"model": MODEL, "prompt": "def long(", "max_tokens": 900, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("server_errors")
    model = make_tiny_model("llama", root / "llama")
    srv = start_server(model, root / "server.log", "--block-size", "32",
                       "--served-model-name", MODEL, "--api-key", KEY, "--max-num-seqs", "1",
                       "--max-queue", "1")
    yield srv
    stop_server(srv)


def wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def metrics(server: Server) -> dict[str, float]:
    return scrape_metrics(server.url, MODEL)  # no key: scrapers carry none


def m(server: Server, name: str) -> float:
    return metrics(server)[name]


CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]

#: (what, path, body (dict, or raw bytes), expected status, text the message must contain)
BAD: list[tuple[str, str, Any, int, str]] = [
    ("malformed JSON", CMPL, b'{"prompt": "x",', 400, "not valid JSON"),
    ("body is not an object", CMPL, b"[1, 2]", 400, "JSON object"),
    ("empty body", CHAT, b"", 400, "not valid JSON"),
    ("missing prompt", CMPL, {"model": MODEL}, 400, "prompt"),
    ("missing messages", CHAT, {"model": MODEL}, 400, "messages"),
    ("unknown model", CMPL, {"model": "gpt-9", "prompt": "x"}, 404, "gpt-9"),
    # Unknown fields are ignored with a warning and "0.5" is a float (lax, as vLLM):
    # test_server_vllm_compat.py checks both.
    ("temperature not a number", CMPL, {"prompt": "x", "temperature": "hot"}, 400,
     "temperature"),
    ("negative temperature", CMPL, {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("top_p out of range", CMPL, {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("max_tokens zero", CMPL, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens fractional", CMPL, {"prompt": "x", "max_tokens": 2.5}, 400, "max_tokens"),
    ("max_tokens beyond context", CMPL, {"prompt": "x", "max_tokens": 5000}, 400, "max_tokens"),
    ("max_completion_tokens beyond context", CHAT,
     {"messages": USER, "max_completion_tokens": 5000}, 400, "max_completion_tokens"),
    ("prompt longer than context", CMPL, {"prompt": [5] * 1100, "max_tokens": 1}, 400,
     "context length"),
    ("token id outside vocab", CMPL, {"prompt": [1, 99999]}, 400, "prompt"),
    ("empty prompt", CMPL, {"prompt": ""}, 400, "prompt"),
    ("mixed prompt list", CMPL, {"prompt": [1, "a"]}, 400, "prompt"),
    ("n zero", CMPL, {"prompt": "x", "n": 0}, 400, "n"),
    ("n above max-num-seqs", CMPL, {"prompt": "x", "n": 5}, 400, "max-num-seqs"),
    ("logprobs too many", CMPL, {"prompt": "x", "logprobs": 50}, 400, "logprobs"),
    ("top_logprobs without logprobs", CHAT, {"messages": USER, "top_logprobs": 2}, 400,
     "top_logprobs"),
    ("stop of wrong type", CMPL, {"prompt": "x", "stop": 7}, 400, "stop"),
    ("stream not a boolean", CMPL, {"prompt": "x", "stream": "maybe"}, 400, "stream"),
    ("stream_options without stream", CMPL,
     {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("presence_penalty out of range", CMPL, {"prompt": "x", "presence_penalty": 5}, 400,
     "presence_penalty"),
    ("min_p out of range", CMPL, {"prompt": "x", "min_p": 2.0}, 400, "min_p"),
    ("top_k negative", CMPL, {"prompt": "x", "top_k": -5}, 400, "top_k"),
    ("min_tokens above max_tokens", CMPL, {"prompt": "x", "max_tokens": 2, "min_tokens": 5},
     400, "min_tokens"),
    ("seed not an integer", CMPL, {"prompt": "x", "seed": 1.5}, 400, "seed"),
    ("best_of below n", CMPL, {"prompt": "x", "best_of": 2}, 400, "best_of"),
    ("logit_bias key not a token id", CMPL, {"prompt": "x", "logit_bias": {"a": 1.0}}, 400,
     "logit_bias"),
    ("empty messages", CHAT, {"messages": []}, 400, "messages"),
    ("bad role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    ("image content part", CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400, "image_url"),
    ("tool without a function", CHAT, {"messages": USER, "tools": [{"type": "function"}]},
     400, "tool"),
    ("tokenize with neither prompt nor messages", "/tokenize", {}, 400, "prompt"),
    ("detokenize bad ids", "/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("unknown route", "/v1/no-such-route", {"input": "x"}, 404, "Not Found"),
    ("embeddings on a generating server", "/v1/embeddings", {"input": "x"}, 400,
     "--runner pooling"),
]


@pytest.mark.parametrize("what,path,body,status,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_request_is_4xx_naming_the_field(server: Server, what: str, path: str, body: Any,
                                             status: int, needle: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=content, headers=AUTH, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert needle in err["message"], err


def test_server_still_answers_after_bad_input(server: Server) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    out = client.completions.create(model=MODEL, prompt="ok", max_tokens=3,
                                    extra_body={"ignore_eos": True})
    assert out.usage is not None and out.usage.completion_tokens == 3
    snap = metrics(server)
    assert snap["glowlm:num_requests_running"] == snap["glowlm:num_requests_waiting"] == 0
    assert snap["glowlm:num_free_kv_cache_blocks"] == snap["glowlm:num_kv_cache_blocks"]


def test_api_key_is_required(server: Server) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(f"{server.url}{CMPL}", json={"prompt": "x"}, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0).models.list()
    assert httpx.get(f"{server.url}/health").status_code == 200  # probes need no key


def _read_first_token(resp: httpx.Response) -> Iterator[str]:
    """Read up to the first token; keep the returned iterator alive (dropping it disconnects)."""
    assert resp.status_code == 200
    lines = resp.iter_lines()
    for line in lines:
        if line.startswith("data: ") and '"text"' in line:
            return lines
    raise AssertionError("the stream ended before its first token")


def test_disconnect_aborts_and_frees_kv_blocks(server: Server) -> None:
    total = m(server, "glowlm:num_kv_cache_blocks")
    aborted = m(server, 'glowlm:request_success_total{finished_reason="abort"}')
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as http, \
            http.stream("POST", CMPL, json={**LONG, "stream": True}) as resp:
        lines = _read_first_token(resp)
        assert m(server, "glowlm:num_free_kv_cache_blocks") < total  # blocks held meanwhile
        del lines
    # The client is closed mid-stream: the server must abort and free at once.
    assert wait_for(lambda: m(server, "glowlm:num_free_kv_cache_blocks") == total, 10), \
        metrics(server)
    assert m(server, "glowlm:num_requests_running") == 0
    assert m(server, 'glowlm:request_success_total{finished_reason="abort"}') == aborted + 1


def test_disconnect_while_waiting_for_a_plain_answer_aborts(server: Server) -> None:
    total = m(server, "glowlm:num_kv_cache_blocks")
    aborted = m(server, 'glowlm:request_success_total{finished_reason="abort"}')
    # A raw connection, closed once the request is running: the client leaves while the
    # server is still generating, however fast this machine finishes 900 tokens.
    url = urlsplit(server.url)
    body = json.dumps(LONG).encode()
    head = (f"POST {CMPL} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        assert wait_for(lambda: m(server, "glowlm:num_requests_running") == 1, 10)
    assert wait_for(lambda: m(
        server, 'glowlm:request_success_total{finished_reason="abort"}') == aborted + 1, 10)
    assert wait_for(lambda: m(server, "glowlm:num_free_kv_cache_blocks") == total, 10)


def test_full_queue_gets_503_with_retry_after(server: Server) -> None:
    waiting_result: dict[str, Any] = {}

    def queued() -> None:
        r = httpx.post(f"{server.url}{CMPL}", headers=AUTH, timeout=60,
                       json={"model": MODEL, "prompt": "q", "max_tokens": 2})
        waiting_result["status"] = r.status_code

    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as http, \
            http.stream("POST", CMPL, json={**LONG, "stream": True}) as resp:
        lines = _read_first_token(resp)  # the long stream occupies the only running slot
        second = threading.Thread(target=queued)
        second.start()  # waits in the queue (1 of 1)
        assert wait_for(lambda: m(server, "glowlm:num_requests_waiting") == 1)
        r = httpx.post(f"{server.url}{CMPL}", headers=AUTH, json={"prompt": "x"})
        assert r.status_code == 503, r.text
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "queue_full"
        del lines
    second.join(60)  # the long stream was dropped, so the queued request runs
    assert waiting_result.get("status") == 200
    assert wait_for(lambda: m(server, "glowlm:num_requests_running") == 0)
