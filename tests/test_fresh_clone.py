"""A fresh clone outside this workspace builds, tests and benchmarks from its own files.

The repository is cloned (its committed state, as a user gets it) into a
temporary directory; there no tracked file may point outside the repository
(``../shared``, ``/work/shared``), every README ``make`` target must resolve
(``make -n``: all prerequisites and recipes exist), and the benchmark-model
script ``make bench-models`` runs must be the clone's own and must run there
(in its ``--smoke`` shapes; the real 1 B model takes minutes and 2 GB).
``make install`` itself is too slow to repeat here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The targets README.md tells people to run.
README_TARGETS = ("install", "demo", "test", "test-slow", "test-reliability", "lint", "bench",
                  "bench-models", "bench-suite", "bench-peers")


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or shutil.which("make") is None:
        pytest.skip("needs git and make")
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    dest = tmp_path_factory.mktemp("fresh") / "glowlm"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(dest)],
                   check=True)
    return dest


def test_no_file_points_outside_the_repository(clone: Path) -> None:
    out = subprocess.run(["git", "grep", "-n", "-I", "-F", "-e", "../shared", "-e", "/work/shared",
                          "--", ".", f":!{Path(__file__).name}", f":!tests/{Path(__file__).name}"],
                         cwd=clone, capture_output=True, text=True)
    assert out.returncode == 1, f"files referring outside the repository:\n{out.stdout}"


def test_readme_targets_resolve(clone: Path) -> None:
    readme = (clone / "README.md").read_text()
    for target in README_TARGETS:
        if f"make {target}" not in readme:
            continue
        run = subprocess.run(["make", "-n", target], cwd=clone, capture_output=True, text=True)
        assert run.returncode == 0, f"make -n {target}:\n{run.stderr}"
    plan = subprocess.run(["make", "-n", "bench-models"], cwd=clone, capture_output=True,
                          text=True, check=True).stdout
    assert "tools/make_bench_models.py" in plan
    assert (clone / "tools" / "make_bench_models.py").is_file()


def test_bench_model_script_runs_in_the_clone(clone: Path, tmp_path: Path) -> None:
    out = tmp_path / "models"
    subprocess.run([sys.executable, "tools/make_bench_models.py", str(out), "--smoke"],
                   cwd=clone, check=True, capture_output=True)
    for name in ("llama-1b-rand", "opt-125m-rand"):
        config = json.loads((out / name / "config.json").read_text())
        assert config["dtype"] == "bfloat16"
        assert (out / name / "model.safetensors").is_file()
        assert (out / name / "tokenizer.json").is_file()
    # the embedding benchmark's checkpoint: a sentence-transformers directory
    subprocess.run([sys.executable, "tools/make_bench_models.py", str(out), "--smoke",
                    "--only", "bert-base-st-rand"], cwd=clone, check=True, capture_output=True)
    st = out / "bert-base-st-rand"
    assert [m["path"] for m in json.loads((st / "modules.json").read_text())] == [
        "", "1_Pooling", "2_Normalize"]
    pooling = json.loads((st / "1_Pooling" / "config.json").read_text())
    # sentence-transformers 6 writes "pooling_mode"; earlier versions one flag per mode
    assert pooling.get("pooling_mode") == "mean" or pooling.get("pooling_mode_mean_tokens")
