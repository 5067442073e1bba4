"""Slow clients: idle connections, unfinished headers and stalled bodies.

Hundreds of connections that send nothing, requests whose headers never end and
bodies that stall must not stop other requests from being served, and the
server must close each of them itself: unfinished heads after
``--request-header-timeout`` (closed), stalled bodies after
``--request-body-timeout`` (408).
"""

from __future__ import annotations

import concurrent.futures
import socket
import time
from typing import Any

import httpx
import pytest
from reliability_harness import (
    AUTH,
    BODY_TIMEOUT,
    CMPL,
    HEADER_TIMEOUT,
    KEY,
    MODEL,
    address,
    healthy,
    http_status,
    record,
)

STALLED_BODY = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n{\"model\": \"tiny\", \"prompt\": \"")
UNFINISHED_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "


def _normal(url: str, i: int) -> int:
    r = httpx.post(url + CMPL, headers=AUTH, timeout=60, json={
        "model": MODEL, "prompt": f"ok {i}", "max_tokens": 8, "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 8
    return r.status_code


def _closed_by_server(sock: socket.socket, within: float) -> bytes | None:
    """What the server sent before closing, or None if it is still open after ``within``."""
    sock.settimeout(within)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return data


def _slow_clients(server: Any, idle: int, heads: int, bodies: int, label: str) -> None:
    opened: list[tuple[str, socket.socket]] = []
    try:
        for _ in range(idle):
            opened.append(("idle", socket.create_connection(address(server))))
        for _ in range(heads):
            s = socket.create_connection(address(server))
            s.sendall(UNFINISHED_HEAD)
            opened.append(("head", s))
        for _ in range(bodies):
            s = socket.create_connection(address(server))
            s.sendall(STALLED_BODY)
            opened.append(("body", s))
        # Every slow connection is open: other clients are still served.
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda i: _normal(server.url, i), range(16)))
        assert statuses == [200] * 16
        # ... and the server closes every slow connection itself.
        deadline = time.monotonic() + max(HEADER_TIMEOUT, BODY_TIMEOUT) + 20
        still_open = 0
        for kind, s in opened:
            reply = _closed_by_server(s, max(0.1, deadline - time.monotonic()))
            if reply is None:
                still_open += 1
            elif kind == "body":
                assert http_status(reply) == 408, reply[:200]
            else:
                assert reply == b"", reply[:200]
        record(f"slow_clients_{label}", f"{idle} idle + {heads} unfinished heads + {bodies} "
                                        f"stalled bodies; {still_open} left open")
        assert still_open == 0
    finally:
        for _, s in opened:
            s.close()
    assert healthy(server)


def test_slow_clients_do_not_stop_others(server: Any) -> None:
    _slow_clients(server, idle=300, heads=30, bodies=30, label="short")


@pytest.mark.slow
def test_many_slow_clients(server: Any) -> None:
    _slow_clients(server, idle=900, heads=50, bodies=50, label="long")
