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
from glowlm.bench import serve as bench_serve
from glowlm.entrypoints.cli import bench as bench_cli
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
    cmd = [sys.executable, "-m", "glowlm.bench.serve", "--base-url",
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


SHAREGPT = [
    {"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"Write a function number {i} that adds two numbers."},
        {"from": "gpt", "value": "def add(a, b):\n    return a + b  # " + "x" * i}]}
    for i in range(8)
] + [{"id": "short", "conversations": [{"from": "human", "value": "hi"}]}]  # skipped


def test_bench_serve_chat_sharegpt_percentiles_warmups_plots(server: ServerProcess,
                                                             tmp_path: Path) -> None:
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(SHAREGPT))
    cmd = [sys.executable, "-m", "glowlm.bench.serve", "--base-url",
           server.url, "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
           "--dataset-name", "sharegpt", "--dataset-path", str(data), "--num-prompts", "5",
           "--num-warmups", "2", "--max-concurrency", "2", "--percentile-metrics",
           "ttft,e2el", "--metric-percentiles", "50,90", "--save-result", "--result-dir",
           str(tmp_path / "results"), "--result-filename", "chat.json", "--plot"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "5/5" in run.stderr  # the progress bar
    assert "P90 E2EL (ms):" in run.stdout and "TPOT" not in run.stdout
    result = json.loads((tmp_path / "results" / "chat.json").read_text())
    assert (result["completed"], result["failed"], result["num_prompts"]) == (5, 0, 5)
    assert result["endpoint"] == "/v1/chat/completions" and result["dataset_name"] == "sharegpt"
    assert {"p50_ttft_ms", "p90_ttft_ms", "p50_e2el_ms", "p90_e2el_ms"} <= set(result)
    assert "p99_ttft_ms" not in result and "mean_tpot_ms" not in result
    assert all(n > 0 for n in result["output_lens"])
    assert sum(result["output_tokens_per_second_timeline"]) >= sum(result["output_lens"]) - 5
    for png in ("chat-latency-cdf.png", "chat-throughput.png"):
        assert (tmp_path / "results" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_serve_prefix_repetition_hits_the_cache(server: ServerProcess,
                                                      tmp_path: Path) -> None:
    from glowlm.testing.server import scrape_metrics

    before = scrape_metrics(server.url, MODEL)["vllm:prefix_cache_hits_total"]
    cmd = [sys.executable, "-m", "glowlm.bench.serve", "--base-url",
           server.url, "--dataset-name", "prefix-repetition", "--num-prompts", "6",
           "--prefix-repetition-prefix-len", "64", "--prefix-repetition-suffix-len", "8",
           "--prefix-repetition-num-prefixes", "2", "--prefix-repetition-output-len", "4",
           "--max-concurrency", "1", "--disable-tqdm", "--save-result",
           str(tmp_path / "r.json")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "req/s]" not in run.stderr and "it/s]" not in run.stderr  # --disable-tqdm
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["completed"] == 6 and result["input_lens"] == [72] * 6
    hits = scrape_metrics(server.url, MODEL)["vllm:prefix_cache_hits_total"] - before
    assert hits >= 4 * 64  # each prefix's later requests reuse its two 32-token blocks


def test_the_bench_verb_has_the_serve_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="glowlm")
    bench_cli.register(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["bench", "serve", "--num-prompts", "3", "--request-rate", "2.5"])
    assert args.func is bench_serve.run
    assert (args.num_prompts, args.request_rate, args.max_concurrency) == (3, 2.5, None)


def test_bench_serve_fails_clearly_without_a_server() -> None:
    run = subprocess.run([sys.executable, "-m", "glowlm.bench.serve",
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
