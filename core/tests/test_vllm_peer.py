"""The vLLM CPU peer's glue (tools/vllm_peer.py) and the peers report's ratios.

vLLM itself runs only in its own venv (``make vllm-peer``), never in the test suite:
these check what glowlm's side builds — the same prompt ids as the protocol, the
documented environment, the command lines — and, where the venv exists, that the
script refuses bad input with one line.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from glowlm.bench import protocol

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))  # the peer scripts are tools/, not installed
import vllm_peer  # noqa: E402


def test_prompt_ids_are_the_protocols() -> None:
    for num, length, seed in ((1, 128, 0), (32, 128, 1), (3, 7, 2)):
        assert vllm_peer.random_prompts(num, length, 32000, seed) == \
            protocol.random_prompts(num, length, 32000, seed)


def test_the_documented_environment(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    env = vllm_peer.vllm_env(tmp_path, 2, 4, base={"PYTHONPATH": "/x", "LD_PRELOAD": "/y.so"})
    preload = env["LD_PRELOAD"].split(":")
    assert str(tmp_path.resolve() / "lib" / "libiomp5.so") in preload and preload[-1] == "/y.so"
    if any(Path(p).is_file() for p in vllm_peer.TCMALLOC_CANDIDATES):
        assert "tcmalloc" in preload[0]
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4" and env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert "PYTHONPATH" not in env
    assert vllm_peer.vllm_env(tmp_path, 1, base={})["VLLM_CPU_OMP_THREADS_BIND"] == "0"


def test_commands() -> None:
    cmd = vllm_peer.command(".venv-vllm", "latency", "/m", "bfloat16", 128, 128, iters=3)
    assert cmd[0].endswith(".venv-vllm/bin/python") and cmd[1].endswith("vllm_peer.py")
    assert cmd[2:4] == ["latency", "/m"] and cmd[-2:] == ["--num-iters", "3"]
    client = vllm_peer.bench_serve_command(".venv-vllm", 8000, "peer", "/m", 128, 128, 64, 8,
                                           "/r", "x.json")
    assert client[:3] == [".venv-vllm/bin/vllm", "bench", "serve"]
    for flag, value in (("--max-concurrency", "8"), ("--num-prompts", "64"),
                        ("--endpoint", "/v1/completions"), ("--dataset-name", "random")):
        assert client[client.index(flag) + 1] == value
    assert "--ignore-eos" in client


def _bench_peers():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("bench_peers", REPO / "tools/bench_peers.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ratios_are_glowlm_over_the_best_peer() -> None:
    bp = _bench_peers()
    r = bp.ratios({"glowlm": {"ttft_ms": 100.0, "decode_tokens_per_s": 20.0},
                   "vllm": {"ttft_ms": 50.0, "decode_tokens_per_s": 10.0},
                   "transformers": {"ttft_ms": 400.0, "decode_tokens_per_s": 25.0}})
    assert r["ttft"] == pytest.approx(0.5)       # vLLM's 50 ms is the best peer
    assert r["decode"] == pytest.approx(0.8)     # transformers' 25 tok/s
    assert r["p2"] is None and r["p3"] is None


@pytest.mark.skipif(not vllm_peer.available(REPO / ".venv-vllm"),
                    reason="no .venv-vllm (make vllm-peer)")
def test_the_script_refuses_a_missing_model_in_one_line(tmp_path: Path) -> None:
    cmd = vllm_peer.command(REPO / ".venv-vllm", "latency", tmp_path / "none", "bfloat16", 4, 2)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=vllm_peer.vllm_env(REPO / ".venv-vllm", 1))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"no config.json in {tmp_path / 'none'}"]


def test_the_chart_script_needs_no_glowlm() -> None:
    for name in ("peers_chart.py", "vllm_peer.py"):
        text = (REPO / "tools" / name).read_text()
        assert not re.search(r"^\s*(from|import)\s+glowlm", text, re.MULTILINE), name


def test_rounds_alternate_the_order_and_keep_the_read_beside_each_p1(
        capsys: pytest.CaptureFixture[str]) -> None:
    bp = _bench_peers()
    assert bp.round_order(["llama.cpp", "glowlm", "vllm"], 0) == ["llama.cpp", "glowlm", "vllm"]
    assert bp.round_order(["llama.cpp", "glowlm", "vllm"], 1) == ["vllm", "glowlm", "llama.cpp"]
    merged = bp.merge_rounds([
        {"decode_tokens_per_s": 25.0, "read_bandwidth_gbs": 60.0, "ttft_ms": 600.0},
        {"decode_tokens_per_s": 17.0, "read_bandwidth_gbs": 37.0, "ttft_ms": 800.0},
        {"decode_tokens_per_s": 24.0, "read_bandwidth_gbs": 58.0, "ttft_ms": 610.0}])
    assert merged["decode_tokens_per_s"] == 24.0 and merged["read_bandwidth_gbs"] == 58.0
    assert merged["rounds"]["read_bandwidth_gbs"] == [60.0, 37.0, 58.0]
    with pytest.raises(SystemExit, match="--rounds must be at least 1"):
        bp.main(["model", "--rounds", "0"])
    report = {"host": {"cpu": "AMD EPYC", "logical_cpus": 2, "flags_that_matter": []},
              "threads": 2, "results": [{"dtype": "bf16", "ratio": {},
                                         "engines": {"glowlm": merged}}]}
    bp.print_table(report)
    assert ("bf16: read GB/s just before each P1 -> decode tok/s: glowlm 60 -> 25.0, "
            "37 -> 17.0, 58 -> 24.0") in capsys.readouterr().out


def test_embed_inputs_are_glowlm_bench_embeds() -> None:
    from glowlm.bench import embed

    for batch, length, vocab, seed in ((1, 128, 30522, 0), (32, 128, 250002, 0), (3, 7, 50, 1)):
        assert vllm_peer.embed_inputs(batch, length, vocab, seed) == \
            embed.inputs(batch, length, vocab, seed)
