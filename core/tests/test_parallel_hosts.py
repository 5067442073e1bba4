"""Ranks on two hosts, simulated on this machine: one command per host, as torchrun does.

Node 0 runs the driver (an ``LLM`` in this process, or ``glowlm serve``); node 1 runs
``glowlm serve ... --node-rank 1 --headless`` as a separate process that connects to
it over TCP on 127.0.0.1 (another port per test). Groups inside one host use shared
memory, groups across the two use gloo; greedy tokens equal TP = 1's with chunked
prefill, preemption and prefix-cache hits (the workload of test_parallel.py). A host
that dies ends the group with one line and leaves no rank process behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from glowlm import LLM, SamplingParams
from glowlm.errors import ConfigError, GlowlmError
from glowlm.testing.parallel import (
    ENGINE,
    child_pids,
    greedy_tokens,
    pid_alive,
    rank_env,
    reference_tokens,
    workload_prompts,
)
from glowlm.testing.server import free_port, start_server, stop_server

ENV = {**rank_env("generic"), "GLOWLM_CPU_KVCACHE_SPACE": "0.02"}


@pytest.fixture(autouse=True)
def _one_thread_per_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)


def _hosts(port: int, tp: int = 2, pp: int = 1) -> dict[str, object]:
    return dict(tensor_parallel_size=tp, pipeline_parallel_size=pp, nnodes=2,
                master_addr="127.0.0.1", master_port=port)


def start_node(model: str, port: int, log: Path, *args: str, node_rank: int = 1
               ) -> subprocess.Popen[bytes]:
    """``glowlm serve MODEL ARGS --nnodes 2 --node-rank 1 ... --headless`` (host 1)."""
    cmd = [sys.executable, "-m", "glowlm.entrypoints.cli.main", "serve", model, *args,
           "--nnodes", "2", "--node-rank", str(node_rank), "--master-addr", "127.0.0.1",
           "--master-port", str(port), "--headless", "--block-size", "32"]
    with log.open("wb") as f:
        return subprocess.Popen(cmd, env={**os.environ, **ENV}, stdout=f,
                                stderr=subprocess.STDOUT)


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.1)
    return not any(pid_alive(p) for p in pids)


def test_tp2_across_two_hosts_matches_tp1(tiny_model_dir, tmp_path: Path) -> None:  # noqa: ANN001
    """TP = 2, one rank per host: the TP group spans the hosts (gloo), the step inputs
    go to host 1 over its connection; then host 1's command exits 0 on its own."""
    model = str(tiny_model_dir("llama"))
    port = free_port()
    node = start_node(model, port, tmp_path / "node1.log", "-tp", "2")
    try:
        assert greedy_tokens(model, **_hosts(port)) == reference_tokens(tiny_model_dir("llama"))
        assert _wait_exit(node) == 0, (tmp_path / "node1.log").read_text()[-3000:]
    finally:
        if node.poll() is None:
            node.kill()
    log = (tmp_path / "node1.log").read_text()
    assert "node 1 of 2: started rank 1" in log and "node 0 stopped the group" in log


@pytest.mark.slow
def test_tp2_pp2_across_two_hosts_matches_tp1(tiny_model_dir, tmp_path: Path) -> None:  # noqa: ANN001
    """Two ranks per host: each stage's TP group in one host's shared memory, the
    pipeline pairs across the hosts (gloo)."""
    model = str(tiny_model_dir("llama"))
    port = free_port()
    node = start_node(model, port, tmp_path / "node1.log", "-tp", "2", "-pp", "2")
    try:
        assert (greedy_tokens(model, **_hosts(port, 2, 2))
                == reference_tokens(tiny_model_dir("llama")))
        assert _wait_exit(node) == 0
    finally:
        if node.poll() is None:
            node.kill()


def test_pp2_across_two_hosts_matches_tp1(tiny_model_dir, tmp_path: Path) -> None:  # noqa: ANN001
    """GPT-2 (biases, tied head), one stage per host: hidden states cross over gloo."""
    model = str(tiny_model_dir("gpt2"))
    port = free_port()
    node = start_node(model, port, tmp_path / "node1.log", "-pp", "2")
    try:
        assert (greedy_tokens(model, **_hosts(port, 1, 2))
                == reference_tokens(tiny_model_dir("gpt2")))
        assert _wait_exit(node) == 0
    finally:
        if node.poll() is None:
            node.kill()


def test_openai_server_on_two_hosts(tiny_model_dir, tmp_path: Path) -> None:  # noqa: ANN001
    """``glowlm serve -tp 2 --nnodes 2`` on host 0 and ``--headless`` on host 1, both real
    commands: the openai client gets TP = 1's greedy text. Host 1 killed: the next
    request fails, /health answers 503 with the line, no rank process is left."""
    openai = pytest.importorskip("openai")
    import httpx

    model = str(tiny_model_dir("llama"))
    prompts = ["def fibonacci(n):", "class Greeter:"]
    llm = LLM(model, block_size=32, kv_cache_space_gib=0.02, show_progress=False)
    expected = [o.outputs[0].text for o in llm.generate(
        prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        use_tqdm=False)]
    port = free_port()
    node = start_node(model, port, tmp_path / "node1.log", "-tp", "2")
    server = start_server(model, tmp_path / "serve.log", "-tp", "2", "--nnodes", "2",
                          "--master-addr", "127.0.0.1", "--master-port", str(port),
                          "--block-size", "32", env=ENV, timeout=300)
    try:
        node_ranks = child_pids(node.pid)
        assert node_ranks, (tmp_path / "node1.log").read_text()[-3000:]
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        name = client.models.list().data[0].id
        for prompt, want in zip(prompts, expected, strict=True):
            got = client.completions.create(model=name, prompt=prompt, max_tokens=12,
                                            temperature=0.0, extra_body={"ignore_eos": True})
            assert got.choices[0].text == want
        node.send_signal(signal.SIGKILL)
        node.wait(10)
        assert _gone(node_ranks), "host 1's ranks outlived its command"
        with pytest.raises(openai.APIError):
            client.completions.create(model=name, prompt=prompts[0], max_tokens=12,
                                      temperature=0.0)
        health = httpx.get(f"{server.url}/health", timeout=5)
        assert health.status_code == 503
        assert "node 1 (" in health.text and "went away" in health.text
    finally:
        stop_server(server)
        if node.poll() is None:
            node.kill()
    log = server.log_tail(20000)
    assert "node 1 joined from 127.0.0.1" in log
    assert "went away: its connection closed; stopped all 2 ranks" in log


def test_a_killed_host_ends_the_group_with_one_line(tiny_model_dir, tmp_path: Path) -> None:  # noqa: ANN001
    """Host 1's command SIGKILLed mid-generation: the driver's step fails with one line
    naming the node; the node's rank died with it (PR_SET_PDEATHSIG)."""
    from glowlm.distributed.shm import RankFailure

    model = str(tiny_model_dir("llama"))
    port = free_port()
    node = start_node(model, port, tmp_path / "node1.log", "-tp", "2")
    llm = LLM(model, **ENGINE, **_hosts(port))
    try:
        node_ranks = child_pids(node.pid)
        assert node_ranks
        node.send_signal(signal.SIGKILL)
        with pytest.raises(RankFailure, match=rf"node 1 \(\S+, pid {node.pid}\) went away: "
                                              r"its connection closed; stopped all 2 ranks"):
            llm.generate([{"prompt_token_ids": p} for p in workload_prompts()],
                         SamplingParams(max_tokens=150, ignore_eos=True), use_tqdm=False)
        assert _gone(node_ranks)
    finally:
        llm.engine.shutdown()
        if node.poll() is None:
            node.kill()


def test_a_killed_driver_stops_the_other_host(tiny_model_dir, tmp_path: Path) -> None:  # noqa: ANN001
    """Host 0's command SIGKILLed: host 1's command stops its ranks and exits with one
    line saying the driver went away."""
    model = str(tiny_model_dir("llama"))
    port = free_port()
    node = start_node(model, port, tmp_path / "node1.log", "-tp", "2")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def fib\n" * 20)  # one at a time: minutes of work
    driver = subprocess.Popen(
        [sys.executable, "-m", "glowlm.entrypoints.cli.main", "generate", model,
         "--prompts-file", str(prompts), "--max-tokens", "900", "--ignore-eos",
         "--max-num-seqs", "1", "-tp", "2", "--nnodes", "2", "--master-port", str(port),
         "--block-size", "32"],
        env={**os.environ, **ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        log = tmp_path / "node1.log"
        while time.monotonic() < deadline and "relaying steps" not in log.read_text():
            assert node.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        node_ranks = child_pids(node.pid)
        assert node_ranks
        time.sleep(0.5)  # generating
        driver.send_signal(signal.SIGKILL)
        assert _wait_exit(node, 30) == 2  # the CLI's exit code for an error line
        assert _gone(node_ranks)
        last = log.read_text().strip().splitlines()[-1]
        assert last.startswith("glowlm: error: ")
        assert "node 0 at 127.0.0.1" in last and "went away" in last, last
    finally:
        for p in (driver, node):
            if p.poll() is None:
                p.kill()


def test_hosts_started_with_different_sizes_are_refused(tiny_model_dir, tmp_path: Path) -> None:  # noqa: ANN001
    model = str(tiny_model_dir("llama"))
    port = free_port()
    node = start_node(model, port, tmp_path / "node1.log", "-tp", "4")  # node 0: -tp 2
    try:
        with pytest.raises(GlowlmError, match="node 1 was started with -tp 4 -pp 1 --nnodes 2, "
                                              "node 0 with -tp 2"):
            LLM(model, **ENGINE, **_hosts(port))
        assert _wait_exit(node) == 2
        log = (tmp_path / "node1.log").read_text()
        assert "glowlm: error: node 1 was started with -tp 4" in log
    finally:
        if node.poll() is None:
            node.kill()


def test_layout_errors_are_one_line(tiny_model_dir) -> None:  # noqa: ANN001
    model = str(tiny_model_dir("llama"))
    with pytest.raises(ConfigError, match="--nnodes 2 does not divide the 3 ranks"):
        LLM(model, **ENGINE, tensor_parallel_size=3, nnodes=2)
    with pytest.raises(ConfigError, match=r"--node-rank must be in 0\.\.1"):
        LLM(model, **ENGINE, tensor_parallel_size=2, nnodes=2, node_rank=2)
    with pytest.raises(ConfigError, match="--node-rank 1 runs no engine: .*--headless"):
        LLM(model, **ENGINE, tensor_parallel_size=2, nnodes=2, node_rank=1)


def test_headless_needs_another_node(tiny_model_dir, tmp_path: Path) -> None:  # noqa: ANN001
    """``--headless`` on node 0, or ``--node-rank 1`` without ``--headless``: one line."""
    model = str(tiny_model_dir("llama"))
    node = start_node(model, free_port(), tmp_path / "n0.log", "-tp", "2", node_rank=0)
    assert _wait_exit(node) == 2
    assert "--headless runs the ranks of another host" in (tmp_path / "n0.log").read_text()
    out = subprocess.run(
        [sys.executable, "-m", "glowlm.entrypoints.cli.main", "serve", model, "-tp", "2",
         "--nnodes", "2", "--node-rank", "1"], env={**os.environ, **ENV},
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "that host runs no API server; add --headless" in out.stderr


def test_cli_flags_reach_the_config() -> None:
    from glowlm.entrypoints.cli.engine_args import engine_kwargs
    from glowlm.entrypoints.cli.main import build_parser

    for verb in (["serve"], ["generate"], ["bench", "latency"], ["bench", "throughput"]):
        args = build_parser().parse_args([*verb, "m", "-tp", "2", "-n", "2", "-r", "1",
                                          "--master-addr", "10.0.0.1", "--master-port", "4000"])
        kw = engine_kwargs(args)
        assert (kw["nnodes"], kw["node_rank"], kw["master_addr"], kw["master_port"]) == \
            (2, 1, "10.0.0.1", 4000), verb
