"""A disconnect storm: 64 concurrent streams, half cut mid-stream.

The cut half must have their requests aborted and their KV blocks freed at once
(``/metrics`` shows every block free and nothing running within a few seconds
of the storm); the other half must finish whole: every token asked for, a
finish reason, the usage chunk and ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from reliability_harness import (
    AUTH,
    CMPL,
    MAX_NUM_SEQS,
    MODEL,
    kv_idle,
    metrics,
    record,
    wait_for,
)

STREAMS = 64
TOKENS = 48
#: A cut stream asks for far more tokens than it reads, so it is surely mid-stream
#: (not finished into the socket buffer) when its client goes.
CUT_TOKENS = 230


async def _one(http: httpx.AsyncClient, i: int, cut: bool) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": f"def storm_{i}(x):",
            "max_tokens": CUT_TOKENS if cut else TOKENS,
            "ignore_eos": True, "stream": True, "seed": i,
            "stream_options": {"include_usage": True}}
    events: list[Any] = []
    async with http.stream("POST", CMPL, json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
            if cut and len(events) == 3:  # a few tokens in: leave, closing the socket
                return {"cut": True, "events": events}
    return {"cut": False, "events": events}


async def _storm(url: str) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=STREAMS + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=120,
                                 limits=limits) as http:
        return await asyncio.gather(*(_one(http, i, i % 2 == 0) for i in range(STREAMS)))


def test_disconnect_storm_frees_every_block(server: Any) -> None:
    assert MAX_NUM_SEQS >= STREAMS
    before = metrics(server)
    total = before["glowlm:num_kv_cache_blocks"]
    aborted = before['glowlm:request_success_total{finished_reason="abort"}']
    results = asyncio.run(_storm(server.url))
    freed_in = wait_for(lambda: kv_idle(server), 10)
    after = metrics(server)
    record("storm_streams", STREAMS)
    record("storm_blocks_freed", f"{int(after['glowlm:num_free_kv_cache_blocks'])}"
                                 f"/{int(total)}")
    record("storm_seconds_to_idle", None if freed_in is None else round(freed_in, 2))
    assert freed_in is not None, after
    assert after["glowlm:num_requests_running"] == 0
    assert after['glowlm:request_success_total{finished_reason="abort"}'] - aborted \
        == STREAMS // 2
    for r in results:
        if r["cut"]:
            continue
        events = r["events"]
        assert events[-1] == "[DONE]"
        usage = events[-2]["usage"]
        assert usage["completion_tokens"] == TOKENS
        finals = [e for e in events[:-2] if e["choices"][0]["finish_reason"]]
        assert [f["choices"][0]["finish_reason"] for f in finals] == ["length"]
        text = "".join(e["choices"][0]["text"] for e in events[:-2])
        assert text, events


@pytest.mark.slow
def test_repeated_storms_leave_nothing_behind(server: Any) -> None:
    total = metrics(server)["glowlm:num_kv_cache_blocks"]
    for _ in range(5):
        asyncio.run(_storm(server.url))
        assert wait_for(lambda: kv_idle(server), 10) is not None
    assert metrics(server)["glowlm:num_free_kv_cache_blocks"] == total
