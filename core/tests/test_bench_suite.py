"""The serving benchmark suite's case selection and dry run (no servers started)."""

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
