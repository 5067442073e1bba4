"""The OpenAI server with tensor parallelism: real ranks behind a real HTTP server."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from glowlm.testing.parallel import child_pids, pid_alive
from glowlm.testing.server import start_server, stop_server


@pytest.fixture(autouse=True)
def _generic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWLM_PLATFORM", "generic")  # the reference engines in this process


def test_openai_server_with_tp2(tiny_model_dir, tmp_path: Path) -> None:  # noqa: ANN001
    """Greedy completions over HTTP with -tp 2 equal the single-rank engine's; SIGTERM
    stops the rank processes too."""
    openai = pytest.importorskip("openai")
    from glowlm import LLM, SamplingParams

    model = str(tiny_model_dir("llama"))
    prompts = ["def fibonacci(n):", "class Greeter:"]
    llm = LLM(model, block_size=32, kv_cache_space_gib=0.02, show_progress=False)
    expected = [o.outputs[0].text for o in llm.generate(
        prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        use_tqdm=False)]
    server = start_server(model, tmp_path / "serve.log", "-tp", "2", "--block-size", "32",
                          env={"GLOWLM_PLATFORM": "generic"}, timeout=300)
    try:
        ranks = child_pids(server.proc.pid)
        assert ranks, server.log_tail()
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
        name = client.models.list().data[0].id
        for prompt, want in zip(prompts, expected, strict=True):
            got = client.completions.create(model=name, prompt=prompt, max_tokens=12,
                                            temperature=0.0, extra_body={"ignore_eos": True})
            assert got.choices[0].text == want
        log = server.log_tail(20000)
        assert "thread binding off" in log and "(rank 1)" in log
    finally:
        stop_server(server)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(pid_alive(p) for p in ranks):
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in ranks)


def _replicas(pid: int) -> list[int]:
    out = []
    for c in child_pids(pid):
        try:
            with open(f"/proc/{c}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"multiprocessing.spawn" in cmd or b"spawn_main" in cmd:
            out.append(c)
    return out


def test_openai_server_with_dp2(tiny_model_dir, tmp_path: Path) -> None:  # noqa: ANN001
    """-dp 2: two engine processes behind one server give the single engine's greedy
    text, /metrics counts both, and a killed replica is reported by /health while the
    other keeps serving."""
    import signal

    import httpx

    openai = pytest.importorskip("openai")
    from glowlm import LLM, SamplingParams
    from glowlm.testing.server import scrape_metrics

    model = str(tiny_model_dir("llama"))
    prompts = ["def fibonacci(n):", "class Greeter:", "return a", "Hello"]
    llm = LLM(model, block_size=32, kv_cache_space_gib=0.02, show_progress=False)
    expected = [o.outputs[0].text for o in llm.generate(
        prompts, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True),
        use_tqdm=False)]
    server = start_server(model, tmp_path / "serve.log", "-dp", "2", "--block-size", "32",
                          env={"GLOWLM_PLATFORM": "generic"}, timeout=300)
    try:
        replicas = _replicas(server.proc.pid)
        assert len(replicas) == 2, server.log_tail()
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
        name = client.models.list().data[0].id
        import concurrent.futures as cf

        def complete(prompt: str) -> str:
            got = client.completions.create(model=name, prompt=prompt, max_tokens=10,
                                            temperature=0.0, extra_body={"ignore_eos": True})
            return got.choices[0].text

        with cf.ThreadPoolExecutor(4) as pool:
            assert list(pool.map(complete, prompts)) == expected
        m = scrape_metrics(server.url, name)
        assert m["vllm:generation_tokens_total"] == 40
        assert "replica 1" in server.log_tail(40000) or "replica 0" in server.log_tail(40000)
        os.kill(replicas[1], signal.SIGKILL)
        deadline = time.monotonic() + 30
        status = 200
        while time.monotonic() < deadline and status == 200:
            complete("def")  # the front notices when it next collects outputs
            status = httpx.get(f"{server.url}/health", timeout=5).status_code
        assert status == 503
        assert "was killed by SIGKILL" in httpx.get(f"{server.url}/health").text
        assert [complete(p) for p in prompts[:2]] == expected[:2]  # the live replica serves
    finally:
        stop_server(server)
