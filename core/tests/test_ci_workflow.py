""".github/workflows/ci.yml, read as data (tools/ci_jobs.py): every job's test files
import only what that job installs, and the matrix has the jobs the docs promise.

Why: a job whose collected test file imports a package it never installs errors at
collection, before any test runs (tests/docker/test_kubernetes.py's kubernetes_validate
did that to every job collecting tests/). Each job's install lines (its pip commands, or
the Makefile's install recipe for a ``make`` step) give the import names it provides,
transitively through the local pyprojects and this venv's metadata, with markers
evaluated for the job's runner; every unguarded import of every test file its pytest
commands collect must be among them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))  # not installed
import ci_jobs  # noqa: E402

JOBS = {job.name: job for job in ci_jobs.load_jobs()}


@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_collected_test_file_imports_only_what_the_job_installs(name: str) -> None:
    problems, _ = ci_jobs.missing_imports(JOBS[name])
    assert problems == [], "\n".join(problems)


def test_the_checker_sees_a_missing_install() -> None:
    """A job like the docker job before its fix: core without the x86 plugin or the
    manifest validator; both are reported."""
    job = ci_jobs.Job(
        "broken",
        "ubuntu-latest",
        [
            "python -m pip install torch==2.13.0\n"
            "GLOWLM_BUILD_KERNELS=0 python -m pip install --no-build-isolation -e ./kernels \\\n"
            "  -e './core[dev]' pyyaml\n",
            "python -m pytest -q -m docker tests/docker\n",
        ],
    )
    problems, _ = ci_jobs.missing_imports(job)
    assert any("kubernetes_validate" in p for p in problems), problems
    assert any("glowlm-x86" in p for p in problems), problems


def test_the_matrix_runs_every_platform_and_zentorch() -> None:
    assert {
        "lint",
        "docker",
        "cross",
        "x86-avx512",
        "x86-avx2",
        "x86-zen",
        "arm64-linux",
        "macos-arm64",
        "s390x",
    } <= set(JOBS)
    zen = JOBS["x86-zen"]
    assert any("zentorch==2.13.0.2" in line for line in zen.install_lines())
    assert ["plugins/zen/tests"] in zen.pytest_paths()
    s390x = "\n".join(JOBS["s390x"].install_lines())
    assert "GLOWLM_BUILD_KERNELS=0" not in s390x  # it builds its kernels
    docker = "\n".join(JOBS["docker"].install_lines())
    assert "./plugins/x86" in docker
