"""Microbenchmark: one shared-memory all-reduce between local ranks.

``glowlm bench allreduce [--ranks 2] [--numel 2048] [--iters 2000]
[--impl both|compiled|python]`` (or ``python -m glowlm.bench.allreduce``) starts the
ranks as processes (spawn, as the engine does), each pinned to its own CPU when there
are enough, runs the all-reduce back to back and prints the median and 90th percentile time
per all-reduce seen by rank 0, and the host CPU. The decode step of a TP engine
does two such all-reduces per layer (attention output, MLP output) of
``tokens x hidden`` values.

Two implementations of one protocol: ``compiled`` is the platform's
``OpsTable.shm_all_reduce`` (what a TP rank runs, inside the fused stacks and
outside them), ``python`` is :meth:`ShmGroup.all_reduce`'s own path (platforms
without the op). The bar applies to what the engine runs: the compiled one where
the platform has it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import time

# torch and the shared-memory group are imported where they run, so ``glowlm --help``
# (which lists this subcommand) does not load them.


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _compiled_op() -> object | None:
    from glowlm.platforms import current_platform

    return current_platform().ops().shm_all_reduce


def _rank(path: str, world: int, rank: int, numel: int, iters: int, impl: str,
          queue: mp.Queue) -> None:
    import torch

    from glowlm.distributed.shm import SPIN_SECONDS, ShmGroup
    from glowlm.runtime.topology import has_affinity, usable_cpu_count

    torch.set_num_threads(1)
    # Spin before sleeping only when every rank has a CPU of its own (as an engine's
    # ranks bound one per CPU list do); decided before pinning this rank to one CPU
    # (where the OS can: macOS has no affinity API, its scheduler places the ranks).
    spread = usable_cpu_count() >= world
    if spread and has_affinity():
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    group = ShmGroup(path, world, rank, spin_seconds=SPIN_SECONDS if spread else 0.0)
    if impl == "compiled":
        group.use_compiled_all_reduce(_compiled_op())  # type: ignore[arg-type]
    x = torch.ones(numel, dtype=torch.float32)
    group.barrier()
    times = []
    for _ in range(iters):
        x.fill_(1.0)
        t0 = time.perf_counter()
        group.all_reduce(x)
        times.append(time.perf_counter() - t0)
    group.barrier()
    ok = bool(torch.all(x == world))
    queue.put((rank, times, ok))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``glowlm bench allreduce``."""
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--numel", type=int, default=2048, help="fp32 values per all-reduce")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--impl", choices=("both", "compiled", "python"), default="both",
                   help="the platform's compiled all-reduce, the Python path, or both "
                        "(default; compiled only where the platform has it)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    impls = ["compiled", "python"] if args.impl == "both" else [args.impl]
    if "compiled" in impls and _compiled_op() is None:
        from glowlm.platforms import current_platform

        print(f"the {current_platform().name} platform has no compiled shm_all_reduce: "
              "timing the Python path only")
        impls = ["python"]
    status = 0
    for impl in impls:
        status |= _run(args, impl, bar=impl == impls[0])
    return status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="glowlm bench allreduce",
                                description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def _run(args: argparse.Namespace, impl: str, bar: bool) -> int:
    from glowlm.distributed.shm import create_segment, unlink_segment

    path = create_segment(args.ranks, "bench")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    try:
        procs = [ctx.Process(target=_rank, args=(path, args.ranks, r, args.numel, args.iters,
                                                 impl, queue), daemon=True)
                 for r in range(args.ranks)]
        for proc in procs:
            proc.start()
        results = {}
        for _ in procs:
            rank, times, ok = queue.get(timeout=300)
            results[rank] = (times, ok)
        for proc in procs:
            proc.join()
    finally:
        unlink_segment(path)
    times, _ = results[0]
    warm = sorted(times[len(times) // 10:])
    med = statistics.median(warm) * 1e6
    p90 = warm[int(0.9 * (len(warm) - 1))] * 1e6
    correct = all(ok for _, ok in results.values())
    verdict = (f"bar: median < 30 us for 2048 values between 2 ranks "
               f"({'met' if med < 30 else 'not met'}"
               f"{'' if (args.ranks, args.numel) == (2, 2048) else ', not this case'}); "
               if bar else "")
    print(f"shared-memory all-reduce ({impl}) of {args.numel} fp32 values, {args.ranks} "
          f"local ranks, {args.iters} iterations: median {med:.1f} us, p90 {p90:.1f} us "
          f"(result {'correct' if correct else 'WRONG'}); {verdict}"
          f"CPU: {cpu_name()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}")
    return 0 if correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
