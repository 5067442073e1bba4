"""Time torch.nn.functional.linear (and the compiled x86 linear, when it loads) on llama-1b shapes.

Usage: python tools/x86/bench_linear.py [--ms 1,2,4,8,16,32,128] [--dtypes bfloat16,float32]
Prints the median ms per call and the GB/s of weight read / GFLOP/s achieved.

``--native ISA`` instead builds ``csrc/test/bench_gemv.cpp`` with that x86 variant's
flags and runs it: in one process, the read bandwidth of the llama-1b decode matrices
(2 MiB pages, all threads, the kernels' own ``parallel_chunks``) beside the decode GEMV's
weight-read rate on the same matrices, fp32 path and (AVX512_BF16) bf16 dot-product
path, M = 1 and 4, and each one's share of the read (docs/performance.md). Arguments
after ``--`` go to the program (``--reps``, ``--shapes NxK,...``, ``--dtypes``,
``--min-mib``). ``--program quant`` runs ``csrc/test/bench_quant.cpp`` instead: the
quantized kernels (4-bit g128 bf16-dot and fp32 paths, 8-bit weight-only, W8A8) on the
same shapes against the read of their packed bytes (``--formats w4,w8,w8a8``);
``--program tp`` runs ``csrc/test/bench_tp.cpp``: one decode step's GEMVs at TP = 1 (two
threads share each matrix) against TP = 2 (each thread its own half-size shards, a barrier
where the engine all-reduces), their ratio (docs/parallelism.md).
The CPU model, its vector flags and the load average are printed with the figures, since
they vary between hosts and minutes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = ((2048, 2048), (8192, 2048), (2048, 8192), (32000, 2048))  # (N out, K in)


def _time(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


#: /proc/cpuinfo flags that decide which GEMV path and vector width run.
VECTOR_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
                "avx512_vnni", "amx_bf16")


def host_line() -> str:
    """The CPU model, its vector flags and the load average, for the head of a report."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    have = " ".join(f for f in VECTOR_FLAGS if f in flags)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    return f"cpu: {model}, {os.cpu_count()} cpus, flags: {have}; load average: {load}"


def run_native(isa: str, threads: int, extra: list[str], program: str = "gemv") -> None:
    """Build csrc/test/bench_{program}.cpp for the x86 variant ``isa`` (cached by command
    and sources) and run it with ``threads`` OpenMP threads."""
    from glowlm.plugin_api import core_env
    from glowlm_kernels.build import CSRC, VARIANTS, compiler, program_command

    source = CSRC / "test" / f"bench_{program}.cpp"
    cxx = compiler() or "g++"
    # bench_quant compiles csrc/torch/quant_*.cpp over the contract driver's ATen subset.
    includes = (CSRC / "test" / "aten_shim",) if program == "quant" else ()

    def command(out: Path) -> list[str]:
        return program_command(VARIANTS["x86"][isa], source, out, cxx, includes=includes)

    h = hashlib.sha256(" ".join(command(Path("-"))).encode())
    for path in sorted(p for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp")):
        h.update(path.read_bytes())
    exe = Path(core_env().kernel_cache) / "bench" / f"bench_{program}-{isa}-{h.hexdigest()[:16]}"
    if not exe.exists():
        exe.parent.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_suffix(".tmp")
        subprocess.run(command(tmp), check=True)
        tmp.rename(exe)
    print(host_line(), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads or os.cpu_count() or 1)}
    proc = subprocess.run([str(exe), *extra], env=env)
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if proc.returncode:
        sys.exit(proc.returncode)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,2,4,8,16,32,128")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--compiled", default="", help="ISA (avx2/avx512): also time the "
                    "compiled gemv and gemm")
    ap.add_argument("--native", default="", metavar="ISA",
                    help="build and run the C++ read-bandwidth and GEMV bench for this x86 "
                         "ISA (avx2, avx512, avx512-bf16) instead; arguments after -- go to it")
    ap.add_argument("--program", default="gemv", choices=("gemv", "quant", "tp"),
                    help="with --native: the dense GEMV bench, the quantized kernels', or "
                         "a decode step's GEMVs at TP = 1 against TP = 2")
    ap.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.native:
        run_native(args.native, args.threads, args.extra, args.program)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    impls: dict[str, Callable[..., torch.Tensor]] = {"torch": F.linear}
    if args.compiled:
        from glowlm.plugin_api import core_env
        from glowlm_x86.kernels import load, ops

        if load(args.compiled, core_env().kernel_cache) is None:
            raise SystemExit("the compiled kernels did not load")
        impls["gemv"] = ops.gemv
        impls["gemm"] = ops.gemm
    print(f"threads={torch.get_num_threads()}")
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        for n, k in SHAPES:
            w = torch.randn(n, k).to(dtype)
            for m in (int(s) for s in args.ms.split(",")):
                x = torch.randn(m, k).to(dtype)
                row = [f"{dname:8s} N={n:5d} K={k:5d} M={m:3d}"]
                for name, fn in impls.items():
                    t = _time(lambda fn=fn, x=x, w=w: fn(x, w, None), args.reps)
                    gbs = w.numel() * w.element_size() / t / 1e9
                    gfl = 2 * m * n * k / t / 1e9
                    row.append(f"{name}: {t * 1e3:7.2f} ms {gbs:5.1f} GB/s {gfl:6.1f} GF/s")
                print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
