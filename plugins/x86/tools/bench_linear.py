"""Time torch.nn.functional.linear (and the compiled x86 linear, when it loads) on llama-1b shapes.

Usage: python plugins/x86/tools/bench_linear.py [--ms 1,2,4,8,16,32,128] [--dtypes bfloat16,float32]
Prints the median ms per call and the GB/s of weight read / GFLOP/s achieved.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,2,4,8,16,32,128")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--compiled", default="", help="ISA (avx2/avx512): also time the "
                    "compiled gemv and gemm")
    args = ap.parse_args()
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
