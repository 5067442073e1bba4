"""Replay the jobs of .github/workflows/ci.yml that this machine can run (``make ci-local``).

Each job runs as GitHub would run it: a fresh venv (``.ci-local/<job>``, from Python 3.11
where installed, as ``setup-python`` gives the jobs), then the job's own ``run:`` steps,
one ``bash -e`` each, in the checkout, with the venv first on ``PATH`` (so ``python``,
``pip``, ``pytest`` and ``glowlm`` are the venv's). Steps needing root (``sudo
apt-get``) run without ``sudo`` as root and are skipped otherwise, saying so. A job
that needs another machine (Arm, macOS, the s390x container) or a tool this one lacks
(docker, qemu) is reported as not run, with the reason; a summary line per job ends
the output and the exit status is non-zero if any job that ran failed.

Usage: python tools/ci_local.py [--jobs lint,x86-avx512] [--keep] [--list]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ci_jobs  # noqa: E402

ROOT = ci_jobs.ROOT
OUT = ROOT / ".ci-local"


def can_run(job: ci_jobs.Job) -> str:
    """``""`` when this machine can run ``job``, else why not."""
    env = job.environment()
    if job.runner == "linux/s390x":
        return "needs docker with qemu binfmt for linux/s390x (the s390x container)"
    if (env["platform_system"], env["platform_machine"]) != (platform.system(), platform.machine()):
        return f"needs a {job.runner} runner ({env['platform_machine']} {env['sys_platform']})"
    text = "\n".join(job.scripts)
    if "tests/docker" in text and shutil.which("docker") is None:
        return "needs docker"
    if "test-cross" in text and not all(
        shutil.which(t)
        for t in ("qemu-aarch64", "qemu-s390x", "aarch64-linux-gnu-g++", "s390x-linux-gnu-g++")
    ):
        return "needs qemu-user and the aarch64/s390x cross compilers"
    return ""


def _python() -> str:
    return shutil.which("python3.11") or sys.executable


def run_job(job: ci_jobs.Job, keep: bool) -> tuple[bool, float]:
    home = OUT / job.name
    if home.exists() and not keep:
        shutil.rmtree(home)
    if not (home / "bin" / "python").exists():
        subprocess.run([_python(), "-m", "venv", str(home)], check=True)
    env = {
        **os.environ,
        "PATH": f"{home / 'bin'}:{os.environ['PATH']}",
        "VIRTUAL_ENV": str(home),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("PYTHONPATH", None)
    start = time.perf_counter()
    for script in job.scripts:
        if "sudo " in script:
            if os.geteuid() != 0:
                print(f"[{job.name}] skipped (needs root): {script.strip()}", flush=True)
                continue
            script = script.replace("sudo ", "")
        print(f"[{job.name}] $ {script.strip()}", flush=True)
        proc = subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, env=env)
        if proc.returncode != 0:
            return False, time.perf_counter() - start
    return True, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--jobs", help="comma-separated job names (default: every one this machine can run)"
    )
    ap.add_argument("--keep", action="store_true", help="reuse each job's venv")
    ap.add_argument("--list", action="store_true", help="list the jobs and whether they run")
    args = ap.parse_args(argv)
    jobs = ci_jobs.load_jobs()
    names = {j.name for j in jobs}
    wanted = set(args.jobs.split(",")) if args.jobs else None
    if wanted and wanted - names:
        print(
            f"unknown job(s) {', '.join(sorted(wanted - names))}; jobs: {', '.join(sorted(names))}",
            file=sys.stderr,
        )
        return 2
    results: list[tuple[str, str]] = []
    failed = False
    for job in jobs:
        why = can_run(job)
        if wanted is not None and job.name not in wanted:
            continue
        if args.list:
            results.append((job.name, "runs here" if not why else f"not here: {why}"))
            continue
        if why:
            results.append((job.name, f"not run: {why}"))
            continue
        ok, seconds = run_job(job, args.keep)
        failed |= not ok
        results.append((job.name, f"{'passed' if ok else 'FAILED'} in {seconds:.0f} s"))
    for name, what in results:
        print(f"ci-local {name}: {what}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
