"""The serving benchmark suite: every case of a JSON file, one command.

For each selected case: start ``glowlm serve`` (its own process group, on a free
port), wait for ``/health``, run ``glowlm bench serve`` saving a JSON result, stop
that server (by its PID only) and go on. Every command is appended to a
``.commands`` file beside the results, with the environment it ran in, so a
run can be replayed by hand. ``DRY_RUN=1`` writes the commands without running.
``MODEL_FILTER`` / ``DTYPE_FILTER`` are regular expressions on the model path
and dtype; ``SERVING_JSON`` names another case file.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from glowlm import envs
from glowlm.errors import ConfigError
from glowlm.executor.hosts import free_port

DEFAULT_CASES = Path("benchmark/serving-tests-cpu.json")
RESULTS = Path("benchmark/results")


@dataclass
class Case:
    name: str
    model: str
    dtype: str
    env: dict[str, str]
    server: dict[str, Any]
    client: dict[str, Any]


def _flags(options: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in options.items():
        if value is True:
            out.append(f"--{key}")
        elif value is not None and value is not False:
            out += [f"--{key}", str(value)]
    return out


def load_cases(path: Path, model_filter: str | None, dtype_filter: str | None) -> list[Case]:
    try:
        spec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the benchmark cases {path}: {exc}") from None
    d = spec.get("defaults", {})
    cases = []
    for t in spec.get("tests", []):
        missing = {"name", "model", "dtype"} - set(t)
        if missing:
            raise ConfigError(f"{path}: a test lacks {', '.join(sorted(missing))}: {t}")
        case = Case(t["name"], t["model"], t["dtype"], {**d.get("env", {}), **t.get("env", {})},
                    {**d.get("server", {}), **t.get("server", {})},
                    {**d.get("client", {}), **t.get("client", {})})
        if model_filter and not re.search(model_filter, case.model):
            continue
        if dtype_filter and not re.search(dtype_filter, case.dtype):
            continue
        cases.append(case)
    return cases


def commands(case: Case, port: int, result_file: Path) -> tuple[list[str], list[str]]:
    glowlm = [sys.executable, "-m", "glowlm.entrypoints.cli.main"]
    serve = glowlm + ["serve", case.model, "--port", str(port), "--dtype", case.dtype,
                      "--disable-access-log", *_flags(case.server)]
    client = glowlm + ["bench", "serve", "--base-url", f"http://127.0.0.1:{port}",
                       "--save-result", str(result_file), *_flags(case.client)]
    return serve, client


def wait_healthy(port: int, proc: subprocess.Popen, what: str = "the server", hint: str = "",
                 timeout: float = 900) -> None:
    """Poll ``/health`` on 127.0.0.1:``port`` until it answers; a ConfigError naming
    ``what`` (and ``hint``) when ``proc`` exits first or ``timeout`` passes. The serving
    suite and the peer benchmarks' P3 (tools/peers_serving.py) wait with it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConfigError(f"{what} exited with code {proc.returncode} before it was "
                              f"ready{hint}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise ConfigError(f"{what} on port {port} was not healthy after {timeout:.0f} s")


def run_suite() -> int:
    settings = envs.bench_suite()
    path = Path(settings.serving_json) if settings.serving_json else DEFAULT_CASES
    cases = load_cases(path, settings.model_filter, settings.dtype_filter)
    if not cases:
        raise ConfigError(f"no benchmark case in {path} matches MODEL_FILTER/DTYPE_FILTER")
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    log = RESULTS / f"{stamp}.commands"
    for i, case in enumerate(cases, 1):
        port = free_port()
        result_file = RESULTS / f"{case.name}.json"
        serve, client = commands(case, port, result_file)
        env_prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in case.env.items())
        with log.open("a") as f:
            f.write(f"# {case.name}\n{env_prefix} {shlex.join(serve)} &\n"
                    f"{shlex.join(client)}\n")
        print(f"[{i}/{len(cases)}] {case.name}" + (" (dry run)" if settings.dry_run else ""),
              flush=True)
        if settings.dry_run:
            continue
        server_log = (RESULTS / f"{case.name}.server.log").open("w")
        proc = subprocess.Popen(serve, env={**os.environ, **case.env}, stdout=server_log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_healthy(port, proc, hint=" (see its log beside the results)")
            subprocess.run(client, check=True)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            server_log.close()
    print(f"commands: {log}" + ("" if settings.dry_run else f"; results in {RESULTS}/"))
    return 0
