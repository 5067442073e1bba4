"""P3 of the peer benchmarks: a server under ``vllm bench serve``, and glowlm's environment.

``tools/bench_peers.py`` measures serving with this: ``glowlm serve`` or ``vllm serve``
in its own process group on a free port, the same client (``vllm bench serve`` from the
vLLM venv) for both, then the server stopped by its process group only. Kept apart
from the P1/P2 driver because it is its own concern (ports, health, process groups,
logs); :func:`glowlm_env` is here because every measured glowlm process, served or
not, gets the same threads and KV cache (``tools/bench_quant_peers.py`` uses it too).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any


def glowlm_env(threads: int, kv_cache_gib: float | None = None) -> dict[str, str]:
    """The environment of a measured glowlm process: ``threads`` CPUs and the KV cache."""
    env = dict(os.environ)
    if threads != os.cpu_count():  # glowlm binds one thread per core it is given
        env["GLOWLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}"
    if kv_cache_gib is not None:
        env["GLOWLM_CPU_KVCACHE_SPACE"] = f"{kv_cache_gib:g}"
    return env


def run_serving(engine: str, model_dir: Path, outtype: str, dtype: str,
                args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """P3: start ``engine``'s server (own process group), ``vllm bench serve`` it, stop it
    (by its process group only); the client's median TTFT/TPOT and output tok/s."""
    import vllm_peer
    from glowlm.bench.suite import wait_healthy
    from glowlm.errors import ConfigError
    from glowlm.executor.hosts import free_port

    port, name = free_port(), "peer-model"
    max_len = args.serve_input_len + args.serve_output_len + 16
    if engine == "glowlm":
        cmd = [args.glowlm_bin, "serve", str(model_dir), "--dtype", dtype,
               "--port", str(port), "--host", "127.0.0.1", "--served-model-name", name,
               "--max-model-len", str(max_len), "--disable-access-log"]
        env = glowlm_env(args.threads, args.kv_cache_gib)
    else:
        cmd = vllm_peer.serve_command(args.vllm_venv, model_dir, dtype, port,
                                      max_len, name)
        env = vllm_peer.vllm_env(args.vllm_venv, args.threads, args.kv_cache_gib)
    log_dir.mkdir(parents=True, exist_ok=True)
    stem = f"p3-{engine}-{outtype}"
    with (log_dir / f"{stem}.server.log").open("w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            try:
                wait_healthy(port, proc, f"{engine} server")
            except ConfigError as exc:
                raise SystemExit(str(exc)) from None
            client = vllm_peer.bench_serve_command(
                args.vllm_venv, port, name, model_dir, args.serve_input_len,
                args.serve_output_len, args.serve_prompts, args.serve_concurrency, log_dir,
                f"{stem}.json")
            # The client runs on the server's CPUs too (2 cores here): it is light, and the
            # same for every server, so the comparison stays fair.
            client_env = vllm_peer.vllm_env(args.vllm_venv, args.threads)
            rc = subprocess.run(client, env=client_env, stdout=log,
                                stderr=subprocess.STDOUT).returncode
            if rc != 0:
                raise SystemExit(f"vllm bench serve against {engine} failed with exit code "
                                 f"{rc}; see {log.name}")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    r = json.loads((log_dir / f"{stem}.json").read_text())
    return {"p3_output_tokens_per_s": r["output_throughput"],
            "p3_median_ttft_ms": r["median_ttft_ms"], "p3_median_tpot_ms": r["median_tpot_ms"],
            "p3_completed": r.get("completed")}
