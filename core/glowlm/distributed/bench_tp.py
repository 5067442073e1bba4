"""Decode speed at TP = N (one CPU share per rank) against TP = 1 (all CPUs), one model.

``python -m glowlm.distributed.bench_tp MODEL [--tp 2] [--dtype bfloat16] [--rounds 3]``
runs ``glowlm bench latency MODEL --json`` in fresh processes, alternating TP = 1 and
TP = N (ABAB..., so a drift of the machine's speed hits both), and prints the median
decode tokens/s of each, their ratio against issue #21's bar (TP = 2 >= 0.85 x TP = 1)
and the host. Both runs use the same CPUs: TP = 1's threads on all of them, TP = N's
ranks each on its share (``GLOWLM_CPU_OMP_THREADS_BIND=auto``: one NUMA node per rank,
or a split of one node's cores), so the ratio is what the all-reduces and the split
cost. Run it on an idle machine: a rank that waits for its CPU stalls every rank.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

from glowlm.distributed.bench_allreduce import _cpu_name

BAR = 0.85


def _run(model: str, tp: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "glowlm.entrypoints.cli.main", "bench", "latency", model,
           "--dtype", args.dtype, "--input-len", str(args.input_len), "--output-len",
           str(args.output_len), "--num-iters", str(args.num_iters), "--json"]
    if tp > 1:
        cmd += ["-tp", str(tp)]
    env = {**os.environ}
    env.setdefault("GLOWLM_CPU_OMP_THREADS_BIND", "auto")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        tail = "\n".join(out.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"glowlm bench latency -tp {tp} failed ({out.returncode}):\n{tail}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m glowlm.distributed.bench_tp",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="model directory (the llama-1b shape: make bench-models)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size to compare")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-iters", type=int, default=3, help="P1 runs per process")
    p.add_argument("--rounds", type=int, default=3, help="TP = 1 / TP = N process pairs")
    args = p.parse_args(argv)
    speeds: dict[int, list[float]] = {1: [], args.tp: []}
    last: dict[int, dict[str, Any]] = {}
    for _ in range(args.rounds):
        for tp in (1, args.tp):
            last[tp] = _run(args.model, tp, args)
            speeds[tp].append(float(last[tp]["decode_tokens_per_s"]))
    one, many = statistics.median(speeds[1]), statistics.median(speeds[args.tp])
    ratio = many / one if one else float("nan")
    verdict = ("met" if ratio >= BAR else "not met") if args.tp == 2 else "applies to TP = 2"
    info = last[1]
    print(f"decode on {args.model} ({info.get('dtype')}, platform {info.get('platform')}, "
          f"input {args.input_len}, output {args.output_len}, median of {args.rounds} "
          f"processes): TP = 1 ({info.get('threads')} threads) {one:.2f} tok/s, "
          f"TP = {args.tp} ({last[args.tp].get('threads')} thread(s) per rank) {many:.2f} "
          f"tok/s; ratio {ratio:.3f} (bar >= {BAR}: {verdict}); runs TP = 1 {speeds[1]}, "
          f"TP = {args.tp} {speeds[args.tp]}; CPU: {_cpu_name()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
