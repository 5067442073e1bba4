"""Regression tests for what one client may cost the server (issue 24's findings).

Each test is one finding: the request-body limit (413, from Content-Length and
while a chunked body streams), prompts refused by their length before they are
tokenized (off the engine thread), header and body timeouts, a client leaving
mid-body logged as that, an OpenAPI schema that describes the API, several API
keys compared in constant time, and one string type for error codes. One real
``glowlm serve`` with small limits serves the module.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from glowlm import envs
from glowlm.entrypoints.cli.serve_settings import http_settings
from glowlm.entrypoints.openai.engine_loop import RequestsCancelled
from glowlm.entrypoints.openai.http_guard import APIKeyMiddleware
from glowlm.entrypoints.openai.serving_base import stream_error
from glowlm.errors import ConfigError
from glowlm.testing.server import ServerProcess as Server
from glowlm.testing.server import start_server, stop_server
from glowlm.testing.tiny_models import make_tiny_model

MODEL = "tiny"
KEYS = ("first-key", "second-key")
AUTH = {"Authorization": f"Bearer {KEYS[1]}"}
LIMIT = 256 * 1024
CMPL = "/v1/completions"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("hardening")
    model = make_tiny_model("llama", root / "llama")
    srv = start_server(model, root / "server.log", "--served-model-name", MODEL,
                       "--api-key", KEYS[0], "--api-key", KEYS[1],
                       "--max-request-body-bytes", str(LIMIT),
                       "--request-header-timeout", "1", "--request-body-timeout", "1.5")
    yield srv
    stop_server(srv)


def _address(server: Server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def _read_until_closed(sock: socket.socket, timeout: float = 15.0) -> bytes:
    """Everything the server sends until it closes the connection (or ``timeout``)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data + b"<still open>"
    except ConnectionResetError:
        pass
    return data


def _ok(server: Server) -> None:
    r = httpx.post(server.url + CMPL, headers=AUTH, timeout=60,
                   json={"model": MODEL, "prompt": "ok", "max_tokens": 4, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4


def test_body_over_the_limit_is_413_from_content_length(server: Server) -> None:
    body = json.dumps({"model": MODEL, "prompt": "x" * (LIMIT + 10)}).encode()
    r = httpx.post(server.url + CMPL, content=body, headers=AUTH, timeout=30)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "request_too_large"
    assert str(LIMIT) in r.json()["error"]["message"]
    _ok(server)


def test_chunked_body_over_the_limit_is_413_while_streaming(server: Server) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: only counting can catch it
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(LIMIT // 4096 + 2):
            yield b"y" * 4096
        yield b'"}'

    r = httpx.post(server.url + CMPL, content=chunks(), headers=AUTH, timeout=30)
    assert r.status_code == 413, r.text
    _ok(server)


def test_huge_prompt_is_refused_by_length_before_tokenizing(server: Server) -> None:
    """A prompt under the body limit but far over the context never reaches the
    tokenizer (the message counts characters, not tokens), and a small request sent
    meanwhile is served."""
    statuses: dict[str, httpx.Response] = {}

    def huge() -> None:
        statuses["huge"] = httpx.post(server.url + CMPL, headers=AUTH, timeout=60, json={
            "model": MODEL, "prompt": "def f(x): return x\n" * (LIMIT // 40), "max_tokens": 1})

    t = threading.Thread(target=huge)
    t.start()
    _ok(server)
    t.join(60)
    r = statuses["huge"]
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "prompt" and err["code"] == "context_length_exceeded"
    assert "characters" in err["message"]
    # Just under the character bound: tokenized (on the tokenizer thread), then refused
    # by its token count.
    r = httpx.post(server.url + CMPL, headers=AUTH, timeout=60,
                   json={"model": MODEL, "prompt": "ab " * 1000, "max_tokens": 1})
    assert r.status_code == 400 and "tokens" in r.json()["error"]["message"], r.text


def test_chat_messages_are_bounded_too(server: Server) -> None:
    r = httpx.post(server.url + "/v1/chat/completions", headers=AUTH, timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "z" * (LIMIT // 2)}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages"


def test_unfinished_headers_are_closed_after_the_header_timeout(server: Server) -> None:
    with socket.create_connection(_address(server)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # never finished
        assert _read_until_closed(sock) == b""
    with socket.create_connection(_address(server)) as sock:  # nothing sent at all
        assert _read_until_closed(sock) == b""
    _ok(server)


def test_stalled_body_gets_408(server: Server) -> None:
    with socket.create_connection(_address(server)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     + KEYS[0].encode() + b"\r\nContent-Length: 200\r\n\r\n{\"model\":")
        reply = _read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"request_timeout" in reply


def test_client_leaving_mid_body_is_logged_as_a_disconnect(server: Server) -> None:
    with socket.create_connection(_address(server)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     + KEYS[0].encode() + b"\r\nContent-Length: 200\r\n\r\n{\"model\":")
        time.sleep(0.3)  # let the server start reading the body
    deadline = time.monotonic() + 10
    while "disconnected while sending the body" not in server.log_tail(20000):
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.1)
    assert "unhandled error" not in server.log.read_text()
    _ok(server)


def test_openapi_describes_bodies_statuses_and_content_types(server: Server) -> None:
    assert httpx.get(server.url + "/openapi.json").status_code == 401
    schema = httpx.get(server.url + "/openapi.json", headers=AUTH).json()
    paths = schema["paths"]
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        op = paths[path]["post"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.rsplit("/", 1)[1] in schema["components"]["schemas"]
        assert {"400", "401", "404", "413"} <= set(op["responses"]), path
    for path, item in paths.items():
        for method, op in item.items():
            assert "422" not in op["responses"], (method, path)
    stream = paths["/v1/completions"]["post"]["responses"]["200"]["content"]
    assert set(stream) == {"application/json", "text/event-stream"}
    for probe in ("/health", "/ping"):
        assert "content" not in paths[probe]["get"]["responses"]["200"]
        r = httpx.get(server.url + probe)
        assert r.status_code == 200 and r.content == b""
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert httpx.get(server.url + "/metrics").headers["content-type"].startswith("text/plain")
    assert "security" not in paths["/health"]["get"]
    assert paths["/v1/models"]["get"]["security"] == [{"bearer": []}]


def test_every_route_but_the_open_ones_needs_a_key(server: Server) -> None:
    for key in KEYS:
        r = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
    for method, path in (("GET", "/v1/models"), ("GET", "/v1/models/tiny"), ("POST", CMPL),
                         ("POST", "/v1/chat/completions"), ("POST", "/tokenize"),
                         ("POST", "/detokenize"), ("GET", "/openapi.json"), ("GET", "/docs"),
                         ("GET", "/no/such/route"), ("OPTIONS", CMPL)):
        for headers in ({}, {"Authorization": "Bearer first-ke"},
                        {"Authorization": f"Bearer {KEYS[0]}x"}, {"Authorization": KEYS[0]}):
            r = httpx.request(method, server.url + path, headers=headers)
            assert r.status_code == 401, (method, path, headers, r.status_code)
            assert r.json()["error"]["type"] == "authentication_error"
    for path in ("/health", "/ping", "/version", "/metrics"):
        assert httpx.get(server.url + path).status_code == 200, path


def test_key_comparison_checks_every_key() -> None:
    mw = APIKeyMiddleware(lambda *a: None, ["a", "bb", "ccc"])  # type: ignore[arg-type]
    assert mw.authorized(b"Bearer bb") and mw.authorized(b"Bearer ccc")
    assert not mw.authorized(b"Bearer b") and not mw.authorized(None)
    assert not mw.authorized(b"bb")


def _args(**given: object) -> argparse.Namespace:
    names = ("api_key", "max_request_body_bytes", "request_header_timeout",
             "request_body_timeout", "timeout_keep_alive", "limit_concurrency")
    return argparse.Namespace(**{n: given.get(n) for n in names})


def test_api_key_and_limits_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWLM_API_KEY", "from-env")
    monkeypatch.setenv("GLOWLM_MAX_REQUEST_BODY_BYTES", "1234")
    monkeypatch.setenv("GLOWLM_HTTP_LIMIT_CONCURRENCY", "77")
    keys, limits = http_settings(_args())
    assert keys == ["from-env"]
    assert limits.max_body_bytes == 1234 and limits.limit_concurrency == 77
    keys, limits = http_settings(_args(api_key=["a", "b"], max_request_body_bytes=99))
    assert keys == ["a", "b"] and limits.max_body_bytes == 99  # flags win
    with pytest.raises(ConfigError, match="GLOWLM_HTTP_BODY_TIMEOUT"):
        envs.server({"GLOWLM_HTTP_BODY_TIMEOUT": "soon"})
    with pytest.raises(ConfigError, match="--request-header-timeout"):
        http_settings(_args(request_header_timeout=0))


def test_tokenizing_runs_off_the_engine_thread(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompts are tokenized on the tokenizer thread with the server's own tokenizer copy,
    so a long prompt never waits behind, or delays, an engine step."""
    import asyncio

    from glowlm.config import EngineConfig
    from glowlm.engine.llm_engine import LLMEngine
    from glowlm.entrypoints.openai.engine_loop import AsyncEngine
    from glowlm.entrypoints.openai.metrics import ServerMetrics

    monkeypatch.setenv("GLOWLM_CPU_KVCACHE_SPACE", "0.02")
    monkeypatch.setenv("GLOWLM_PLATFORM", "generic")
    engine = LLMEngine(EngineConfig.create(str(make_tiny_model("llama", tmp_path / "m")),
                                           online=True))
    driver = AsyncEngine(engine, ServerMetrics(MODEL))

    async def main() -> tuple[str, str, list[int]]:
        where = await driver.run_tokenizer(lambda: threading.current_thread().name)
        engine_side = await driver.run(lambda: threading.current_thread().name)
        ids = await driver.run_tokenizer(driver.tokenize, "def f(x): return x")
        await driver.shutdown()
        return where, engine_side, ids

    where, engine_side, ids = asyncio.run(main())
    assert where.startswith("glowlm-tokenizer") and engine_side.startswith("glowlm-engine")
    assert driver.tokenizer is not engine.tokenizer
    assert ids == list(engine.tokenizer.encode("def f(x): return x"))
    assert driver.max_token_chars == max(len(t) for t in engine.tokenizer.get_vocab())


def test_stream_error_codes_are_strings_like_plain_errors() -> None:
    event = stream_error(RequestsCancelled("the server is shutting down"))
    err = json.loads(event.removeprefix("data: "))["error"]
    assert err["code"] == "shutting_down" and err["type"] == "service_unavailable"
    err = json.loads(stream_error(RuntimeError("x")).removeprefix("data: "))["error"]
    assert err["code"] == "engine_failure"


def test_limits_are_documented() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "server.md").read_text()
    for needle in ("--max-request-body-bytes", "GLOWLM_MAX_REQUEST_BODY_BYTES",
                   "--request-header-timeout", "--request-body-timeout",
                   "--timeout-keep-alive", "--limit-concurrency", "GLOWLM_API_KEY", "413"):
        assert needle in doc, needle


def test_stream_events_survive_line_splitters_that_split_on_unicode_breaks() -> None:
    """Sampled text may hold U+2028, U+0085, \\x1c...; ``str.splitlines`` and httpx's
    ``iter_lines`` split there, so the event must carry them JSON-escaped (same payload)."""
    from glowlm.entrypoints.openai.serving_base import sse

    text = "a\u2028b\u2029c\x85d\x1ce\x1df\x1eg\x0bh\x0ci é\u00e9"
    event = sse({"choices": [{"text": text}]})
    lines = event.splitlines()
    assert lines == [lines[0], ""], lines
    assert json.loads(lines[0].removeprefix("data: "))["choices"][0]["text"] == text
    decoder = httpx._decoders.LineDecoder()  # what ``Response.iter_lines`` runs
    assert [ln for ln in decoder.decode(event) + decoder.flush() if ln] == [lines[0]]
