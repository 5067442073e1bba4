"""The serving benchmark suite: case selection, the dry run, and one real tiny case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from glowlm.bench.suite import load_cases

CASES = Path(__file__).resolve().parents[2] / "benchmark" / "serving-tests-cpu.json"


def test_filters_select_cases():
    everything = load_cases(CASES, None, None)
    assert len(everything) >= 4
    opt = load_cases(CASES, "opt", None)
    assert opt and all("opt" in c.model for c in opt)
    fp32 = load_cases(CASES, None, "float32")
    assert fp32 and all(c.dtype == "float32" for c in fp32)
    assert all(c.client["seed"] == 0 for c in everything)  # defaults merged


def test_dry_run_writes_commands_only(tmp_path):
    spec = {"defaults": {"client": {"num-prompts": 2}},
            "tests": [{"name": "tiny", "model": "/nonexistent/model", "dtype": "float32"}]}
    (tmp_path / "cases.json").write_text(json.dumps(spec))
    env = {**os.environ, "DRY_RUN": "1", "SERVING_JSON": str(tmp_path / "cases.json")}
    r = subprocess.run([sys.executable, "-m", "glowlm.entrypoints.cli.main", "bench", "suite"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    commands = list((tmp_path / "benchmark" / "results").glob("*.commands"))
    assert len(commands) == 1
    text = commands[0].read_text()
    assert "serve /nonexistent/model" in text and "bench serve" in text
    assert "--num-prompts 2" in text
    assert not list((tmp_path / "benchmark" / "results").glob("*.json"))


def test_one_real_case_serves_benches_and_stops(tmp_path):
    """A tiny case end to end: start glowlm serve, wait for /health, bench, stop it."""
    from glowlm.testing.tiny_models import make_tiny_model

    model = make_tiny_model("llama", tmp_path / "llama")
    spec = {"defaults": {"env": {"GLOWLM_CPU_KVCACHE_SPACE": "0.05",
                                 "GLOWLM_CPU_OMP_THREADS_BIND": "nobind",
                                 "OMP_NUM_THREADS": "1", "GLOWLM_DISABLE_KERNELS": "1"},
                         "server": {"block-size": 32},
                         "client": {"num-prompts": 4, "random-input-len": 8,
                                    "random-output-len": 4, "disable-tqdm": True}},
            "tests": [{"name": "tiny", "model": str(model), "dtype": "float32"}]}
    (tmp_path / "cases.json").write_text(json.dumps(spec))
    env = {**os.environ, "SERVING_JSON": str(tmp_path / "cases.json")}
    env.pop("DRY_RUN", None)
    r = subprocess.run([sys.executable, "-m", "glowlm.entrypoints.cli.main", "bench", "suite"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    results = tmp_path / "benchmark" / "results"
    result = json.loads((results / "tiny.json").read_text())
    assert (result["completed"], result["failed"]) == (4, 0)
    assert result["output_lens"] == [4] * 4
    log = (results / "tiny.server.log").read_text()
    assert "serving" in log and "Finished server process" in log  # stopped, not killed
