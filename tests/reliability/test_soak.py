"""A soak at the server's maximum concurrency with a mix of requests.

As many clients as ``--max-num-seqs`` send, back to back, a random mix:
streamed or not, chat or completions, ``n`` of 1 or 2, stop strings, random
temperature / top_p / top_k / seeds / lengths. Every answer must be a 200 whose
shape and token counts are right (0 errors). Reported: requests, p50/p99
latency, RSS after the warm-up, at the middle and at the end; RSS may grow less
than 5 % after the warm-up (plus the KV cache's size: its pages become resident as
blocks are first written), and at the end every KV block must be free.
The default run soaks for ``SHORT`` seconds, ``slow`` for ``LONG``.

The server runs with oneDNN's primitive cache off (``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0``).
oneDNN keeps a JIT-compiled primitive for each new matmul shape it sees, up to 1,024 of
them. Each prefill step of the mix has a new token count, so that cache fills for
minutes: on a 2-vCPU EPYC, with the cache on, the heap grew about 5 MiB for every
~570 requests; with it off, about 2 MiB. tracemalloc found no Python objects
left behind. The cache is bounded, so this growth is not a leak, but it would hide
one. What the soak measures is glowlm's own memory. docs/runtime.md, "Memory over
time", describes the cache's growth for users.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from glowlm.testing.server import KV_CACHE_GIB, ServerProcess, stop_server
from reliability_harness import AUTH, CHAT, CMPL, MODEL, kv_idle, record, rss_bytes, serve, wait_for

CONCURRENCY = 8
WARMUP, SHORT, LONG = 5.0, 15.0, 300.0
TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")
WORDS = ["def", "class", "return", "import", "lambda", "yield", "async", "(", ")", ":"]


@pytest.fixture(scope="module")
def soak_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("soak")
    (root / "template.jinja").write_text(TEMPLATE)
    srv = serve(tiny_model, root / "server.log", "--max-num-seqs", str(CONCURRENCY),
                "--max-model-len", "256", "--chat-template", str(root / "template.jinja"),
                "--disable-access-log", env={"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"})
    yield srv
    assert stop_server(srv) == 0, srv.log_tail()
    assert "unhandled error" not in srv.log.read_text()


def _request(rng: random.Random) -> tuple[str, dict[str, Any], int]:
    """(path, body, completion tokens expected per choice, or 0: at most max_tokens)."""
    chat = rng.random() < 0.4
    n = rng.choice([1, 1, 1, 2])
    max_tokens = rng.randint(4, 40)
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))
    body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "n": n,
                            "stream": rng.random() < 0.5,
                            "temperature": rng.choice([0.0, 0.7, 1.0, 1.3]),
                            "top_p": rng.choice([1.0, 0.9, 0.5]),
                            "top_k": rng.choice([-1, 0, 5, 50])}
    if rng.random() < 0.5:
        body["seed"] = rng.randint(0, 2**31)
    exact = rng.random() < 0.5
    if exact:
        body["ignore_eos"] = True
    elif rng.random() < 0.5:
        body["stop"] = [rng.choice(WORDS), "\n\n"]
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return (CHAT if chat else CMPL), body, (max_tokens if exact else 0)


async def _check(resp: httpx.Response, body: dict[str, Any], exact: int) -> None:
    assert resp.status_code == 200, resp.text
    if body["stream"]:
        # SSE ends lines at LF only (str.splitlines would also split on U+2028 &c.).
        lines = [ln for ln in resp.text.split("\n") if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        events = [json.loads(ln[6:]) for ln in lines[:-1]]
        assert all("error" not in e for e in events), events
        usage = events[-1]["usage"]
        finished = {c["index"] for e in events for c in e["choices"] if c["finish_reason"]}
        assert finished == set(range(body["n"]))
    else:
        data = resp.json()
        usage = data["usage"]
        assert len(data["choices"]) == body["n"]
        assert all(c["finish_reason"] in ("length", "stop") for c in data["choices"])
    limit = body["max_tokens"] * body["n"]
    assert 1 <= usage["completion_tokens"] <= limit
    if exact:
        assert usage["completion_tokens"] == limit


async def _soak(url: str, seconds: float, seed: int) -> tuple[list[float], list[str]]:
    latencies: list[float] = []
    errors: list[str] = []
    stop_at = time.monotonic() + seconds

    async def worker(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=120) as http:
            while time.monotonic() < stop_at:
                path, body, exact = _request(rng)
                start = time.perf_counter()
                try:
                    resp = await http.post(path, json=body)
                    await _check(resp, body, exact)
                except Exception as exc:  # noqa: BLE001 - every failure is counted
                    errors.append(f"{path} {json.dumps(body)[:200]}: {exc!r}"[:500])
                latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker(k) for k in range(CONCURRENCY)))
    return latencies, errors


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _run(server: ServerProcess, seconds: float, label: str) -> None:
    pid = server.proc.pid
    asyncio.run(_soak(server.url, WARMUP, seed=0))  # warm-up: allocator pools, caches
    rss = [rss_bytes(pid)]
    first, errors_a = asyncio.run(_soak(server.url, seconds / 2, seed=1))
    rss.append(rss_bytes(pid))
    second, errors_b = asyncio.run(_soak(server.url, seconds / 2, seed=2))
    rss.append(rss_bytes(pid))
    latencies, errors = first + second, errors_a + errors_b
    growth = (rss[2] - rss[0]) / rss[0] * 100
    idle = wait_for(lambda: kv_idle(server), 10)
    record(f"soak_{label}_seconds", seconds)
    record(f"soak_{label}_requests", len(latencies))
    record(f"soak_{label}_errors", len(errors))
    record(f"soak_{label}_latency_p50_s", round(_percentile(latencies, 0.5), 3))
    record(f"soak_{label}_latency_p99_s", round(_percentile(latencies, 0.99), 3))
    record(f"soak_{label}_rss_mib_start_mid_end", [round(r / 2**20, 1) for r in rss])
    record(f"soak_{label}_rss_growth_pct", round(growth, 2))
    assert not errors, errors[:5]
    assert latencies
    # The KV cache is mapped lazily (pages resident once first written), so blocks
    # first used during the soak add up to the cache's size (start_server's).
    assert rss[2] - rss[0] < 0.05 * rss[0] + KV_CACHE_GIB * 2**30, rss
    assert idle is not None


def test_soak_short(soak_server: ServerProcess) -> None:
    _run(soak_server, SHORT, "short")


@pytest.mark.slow
def test_soak_long(soak_server: ServerProcess) -> None:
    _run(soak_server, LONG, "long")
