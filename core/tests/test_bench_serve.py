"""``glowlm bench serve`` against a real ``glowlm serve``, and the server's graceful shutdown.

The shutdown test ends the module's server, so it runs last.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from glowlm.entrypoints.cli import bench_serve
from glowlm.testing.server import ServerProcess, start_server, stop_server
from glowlm.testing.tiny_models import make_tiny_model

MODEL = "tiny"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("bench_serve")
    model = make_tiny_model("llama", root / "llama")
    srv = start_server(model, root / "server.log", "--block-size", "32",
                       "--served-model-name", MODEL, "--graceful-shutdown-timeout", "3")
    yield srv
    stop_server(srv)


def test_bench_serve_reports_figures_and_saves_json(server: ServerProcess,
                                                    tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "glowlm.entrypoints.cli.bench_serve", "--base-url",
           server.url, "--num-prompts", "8", "--request-rate", "inf", "--max-concurrency", "4",
           "--random-input-len", "16", "--random-output-len", "8", "--seed", "1",
           "--save-result", str(out), "--metadata", "case=tiny"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    for label in ("Request throughput (req/s):", "Output token throughput (tok/s):",
                  "Mean TTFT (ms):", "Median TPOT (ms):", "P99 ITL (ms):"):
        assert label in run.stdout
    result = json.loads(out.read_text())
    assert (result["completed"], result["failed"]) == (8, 0)
    assert result["output_lens"] == [8] * 8  # ignore_eos: lengths are exact
    assert result["total_input_tokens"] == 8 * 16
    assert result["case"] == "tiny" and result["model_id"] == MODEL
    assert result["request_throughput"] > 0 and result["output_throughput"] > 0
    assert 0 < result["median_ttft_ms"] <= result["p99_ttft_ms"]
    assert result["mean_tpot_ms"] > 0 and result["p99_itl_ms"] > 0
    assert all(len(itl) == 7 for itl in result["itls"])  # one chunk per token


def test_register_serve_bench_adds_the_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="glowlm bench")
    bench_serve.register_serve_bench(parser.add_subparsers(dest="bench"))
    args = parser.parse_args(["serve", "--num-prompts", "3", "--request-rate", "2.5"])
    assert args.func is bench_serve.run
    assert (args.num_prompts, args.request_rate, args.max_concurrency) == (3, 2.5, None)


def test_bench_serve_fails_clearly_without_a_server() -> None:
    run = subprocess.run([sys.executable, "-m", "glowlm.entrypoints.cli.bench_serve",
                          "--base-url", "http://127.0.0.1:9", "--num-prompts", "1"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "cannot reach the server" in run.stderr


def _stream(url: str, max_tokens: int, result: dict[str, Any], n: int = 1) -> None:
    body = {"model": MODEL, "prompt": "def f(", "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "n": n, "temperature": 1.0}
    lines: list[str] = []
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as resp:
            for line in resp.iter_lines():
                if line:
                    lines.append(line)
                    result["started"] = True
    except httpx.HTTPError as exc:
        result["error"] = repr(exc)
    result["lines"] = lines


def test_sigterm_drains_then_aborts_and_exits_cleanly(server: ServerProcess) -> None:
    short: dict[str, Any] = {}
    long: dict[str, Any] = {}
    # The long request is 32 completions of 990 tokens: hundreds of steps even on a fast
    # machine, so it is surely still running when the 3 s drain ends; the short one
    # needs 10 steps, so it surely finishes within it.
    threads = [threading.Thread(target=_stream, args=(server.url, 10, short)),
               threading.Thread(target=_stream, args=(server.url, 1000 - 10, long, 32))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while not (short.get("started") and long.get("started")) and time.monotonic() < deadline:
        time.sleep(0.05)
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(30)
    for t in threads:
        t.join(30)
    log = server.log_tail(6000)
    assert code == 0, log
    assert short["lines"][-1] == "data: [DONE]"  # drained: finished normally
    assert '"finish_reason": "length"' in short["lines"][-2]
    # Still running after --graceful-shutdown-timeout 3: ended with an error event.
    assert long["lines"][-1] == "data: [DONE]" and "shutting down" in long["lines"][-2]
    # The short request may already be done when SIGTERM arrives.
    assert re.search(r"draining [12] request\(s\)", log) and "Finished server process" in log
    assert "Traceback" not in log
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server.url}/health", timeout=2)
    assert stop_server(server) == 0
