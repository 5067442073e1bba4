"""The offline verbs as users run them: real subprocesses of the `glowlm` command."""

from __future__ import annotations

import json
import subprocess
import sys

ENV_SMALL = {"GLOWLM_CPU_KVCACHE_SPACE": "0.02", "GLOWLM_LOG_LEVEL": "WARNING"}


def _glowlm(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, **ENV_SMALL, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "glowlm.entrypoints.cli.main", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_generate_streams_the_completion(tiny_model_dir):
    r = _glowlm("generate", str(tiny_model_dir("llama")), "--prompt", "def f(x):",
                "--max-tokens", "8", "--ignore-eos", "--block-size", "32")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("def f(x):") and len(r.stdout) > len("def f(x):\n")


def test_generate_batch_file(tiny_model_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def a():\n{\"prompt\": \"class B:\"}\n")
    out = tmp_path / "out.jsonl"
    r = _glowlm("generate", str(tiny_model_dir("llama")), "--prompts-file", str(prompts),
                "--output", str(out), "--max-tokens", "4", "--block-size", "32")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == ["def a():", "class B:"]
    assert all(row["outputs"][0]["num_tokens"] >= 1 for row in rows)


def test_bad_model_dir_is_one_line(tmp_path):
    r = _glowlm("generate", str(tmp_path / "nope"), "--prompt", "x")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("glowlm: error:")
    assert "Traceback" not in r.stderr


def test_bench_latency_json(tiny_model_dir):
    r = _glowlm("bench", "latency", str(tiny_model_dir("opt")), "--input-len", "16",
                "--output-len", "8", "--num-iters", "1", "--json", "--block-size", "32")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("ttft_ms", "decode_tokens_per_s", "platform", "dtype", "threads",
                "python_overhead_fraction"):
        assert key in result
    assert result["decode_tokens_per_s"] > 0


def test_bench_throughput_json(tiny_model_dir):
    r = _glowlm("bench", "throughput", str(tiny_model_dir("gpt2")), "--input-len", "16",
                "--output-len", "8", "--num-prompts", "4", "--json", "--block-size", "32")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["output_tokens_per_s"] > 0 and result["total_tokens_per_s"] > 0
