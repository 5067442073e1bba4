"""Decode speed at TP = N (one CPU share per rank) against TP = 1 (all CPUs), one model.

``glowlm bench tp MODEL [--tp 2] [--dtype bfloat16] [--rounds 6]`` (or ``python -m
glowlm.bench.tp``) keeps two engines loaded side by side, each in its own process
(TP = 1; TP = N, whose driver starts its ranks), and alternates single P1 runs between
them: TP = 1, TP = N, then TP = N, TP = 1, and so on, one engine idle (its threads and
ranks asleep in the kernel) while the other runs. It prints every run's decode
tokens/s, the median of each engine and their ratio, the median of the per-pair ratios
against issue #21's bar (TP = 2 >= 0.85 x TP = 1), the two-thread read measured just
before every run, and the host.

Why interleaved runs rather than fresh processes: on a shared VM the memory read moves
between ~35 and ~64 GB/s from one minute to the next, and bf16 decode follows it. A
process measures for ~30 s, so two processes in a row often see different memories and
the ratio of a few such pairs moved between 0.63 and 0.93 with the same code
(docs/parallelism.md). Alternating single runs brings the two figures of a pair from
~40 s apart to ~6 s, and every pair is printed with the read before each run, so a pair
split by a change of speed shows.

Both engines use the same CPUs: TP = 1's threads all of them, TP = N's ranks each its
share (``GLOWLM_CPU_OMP_THREADS_BIND=auto``: one NUMA node per rank, or a split of one
node's cores), so the ratio is what the all-reduces and the split cost. Run it on an
idle machine: a rank that waits for its CPU stalls every rank.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import IO, Any

from glowlm.bench.allreduce import cpu_name

BAR = 0.85
_TURN = "turn"  # a worker's line: loaded (or done with a run) and waiting for "go"


def _worker(args: argparse.Namespace) -> int:
    """One engine: warm up, then one P1 run per "go" on stdin; the runs as JSON at the end."""
    from glowlm.bench import offline, protocol

    parser = argparse.ArgumentParser()
    offline.add_arguments(parser, "latency")
    cli = [args.model, "--dtype", args.dtype]
    cli += ["-tp", str(args.worker)] if args.worker > 1 else []
    engine = offline.build_engine(parser.parse_args(cli))

    def turn() -> None:
        print(_TURN, flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit(0)  # the parent went away or stopped early

    lat = protocol.measure_latency(engine, args.input_len, args.output_len,
                                   iters=args.rounds, between=turn)
    print(json.dumps({**offline.context(engine), "runs": lat.runs}), flush=True)
    return 0


def _start(tp: int, args: argparse.Namespace) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "glowlm.bench.tp", args.model, "--worker",
           str(tp), "--dtype", args.dtype, "--input-len", str(args.input_len),
           "--output-len", str(args.output_len), "--rounds", str(args.rounds)]
    env = {**os.environ}
    env.setdefault("GLOWLM_CPU_OMP_THREADS_BIND", "auto")
    # Two engines share the memory: with the default 4 GiB of KV cache each, the second
    # one's memory plan left too little to offer the linear candidates that keep weight
    # copies (packed, oneDNN), so it would not run as it does alone. P1 needs 256 tokens.
    env.setdefault("GLOWLM_CPU_KVCACHE_SPACE", "1")
    return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def _expect(proc: subprocess.Popen[str], tp: int) -> str:
    """The worker's next protocol line (a turn or its JSON; anything else that reaches
    stdout is passed on to stderr); its exit as one readable error."""
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"the TP = {tp} engine exited with code {proc.wait()} (its "
                             "messages are above)")
        if line.strip() == _TURN or line.startswith("{"):
            return line.strip()
        sys.stderr.write(line)


def _go(proc: subprocess.Popen[str]) -> None:
    stdin: IO[str] | None = proc.stdin
    assert stdin is not None
    stdin.write("go\n")
    stdin.flush()


def pair_order(tps: tuple[int, int], round_index: int) -> tuple[int, int]:
    """ABBA: the engine that runs first swaps every round, so a steady drift of the
    machine's speed favours neither."""
    return tps if round_index % 2 == 0 else (tps[1], tps[0])


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``glowlm bench tp``."""
    p.add_argument("model", help="model directory (the llama-1b shape: make bench-models)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size to compare")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=6,
                   help="P1 runs per engine, alternated (after one warm-up run each)")
    p.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="glowlm bench tp", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if args.worker:
        return _worker(args)
    if args.tp < 2 or args.rounds < 1:
        raise SystemExit("--tp must be at least 2 and --rounds at least 1")
    tps = (1, args.tp)
    procs: dict[int, subprocess.Popen[str]] = {}
    try:
        for tp in tps:  # one at a time: loads and warm-ups do not overlap
            print(f"loading the TP = {tp} engine", file=sys.stderr, flush=True)
            procs[tp] = _start(tp, args)
            _expect(procs[tp], tp)
        from glowlm.bench.protocol import read_bandwidth

        reads: dict[int, list[float]] = {tp: [] for tp in tps}
        for r in range(args.rounds):
            for tp in pair_order(tps, r):
                reads[tp].append(read_bandwidth(repeats=5, huge_pages=True).median_gbs)
                _go(procs[tp])
                _expect(procs[tp], tp)  # the next turn: the run is done
            print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)
        results = {}
        for tp in tps:
            _go(procs[tp])  # past the last turn: the worker prints its runs
            results[tp] = json.loads(_expect(procs[tp], tp))
            procs[tp].wait(timeout=120)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    report(args, results, reads)
    return 0


def report(args: argparse.Namespace, results: dict[int, dict[str, Any]],
           reads: dict[int, list[float]]) -> None:
    """Both medians and their ratio, and the median of the per-pair ratios, which is the
    verdict: a pair's two runs are seconds apart, where the two medians may come from
    minutes with different memory speeds. Every pair is printed with the read measured
    just before each of its runs, so a pair split by a change of speed shows."""
    speeds = {tp: [r["decode_tokens_per_s"] for r in res["runs"]] for tp, res in results.items()}
    one, many = statistics.median(speeds[1]), statistics.median(speeds[args.tp])
    ratio = many / one if one else float("nan")
    pairs = [b / a for a, b in zip(speeds[1], speeds[args.tp], strict=True) if a]
    paired = statistics.median(pairs)
    verdict = ("met" if paired >= BAR else "not met") if args.tp == 2 else "applies to TP = 2"
    info = results[1]
    print(f"decode on {args.model} ({info.get('dtype')}, platform {info.get('platform')}, "
          f"input {args.input_len}, output {args.output_len}, {args.rounds} alternated runs "
          f"each): TP = 1 ({info.get('threads')} threads) {one:.2f} tok/s, TP = {args.tp} "
          f"({results[args.tp].get('threads')} thread(s) per rank) {many:.2f} tok/s, ratio "
          f"of medians {ratio:.3f}; median of the per-pair ratios {paired:.3f} (bar >= "
          f"{BAR}: {verdict})")
    for r, (a, b) in enumerate(zip(speeds[1], speeds[args.tp], strict=True)):
        print(f"  pair {r + 1}: TP = 1 {a:.2f} tok/s (read {reads[1][r]:.0f} GB/s before), "
              f"TP = {args.tp} {b:.2f} tok/s (read {reads[args.tp][r]:.0f} GB/s): {b / a:.3f}")
    print(f"CPU: {cpu_name()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    raise SystemExit(main())
