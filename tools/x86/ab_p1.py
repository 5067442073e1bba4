"""Interleaved A/B of P1 (TTFT and decode tok/s) between two platforms in one process.

Usage: python tools/x86/ab_p1.py MODEL --dtype bfloat16 [--a x86] [--b generic]
       [--rounds 3] [--output-len 64]
On a shared machine, run-to-run drift is larger than some differences being
measured; alternating A and B runs in one process and comparing medians of each
side cancels most of it. The prompt is the protocol's P1 prompt (seed 0).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from glowlm import LLM, SamplingParams


def p1(llm: LLM, ids: list[int], output_len: int, tag: str) -> tuple[float, float]:
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    engine.add_request(tag, {"prompt_token_ids": ids}, params)
    t0 = time.perf_counter()
    engine.step()
    t1 = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (output_len - 1) / (t2 - t1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--a", default="x86")
    ap.add_argument("--b", default="generic")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output-len", type=int, default=64)
    args = ap.parse_args()
    engines = {name: LLM(args.model, platform=name, dtype=args.dtype, block_size=32,
                         kv_cache_space_gib=0.25, max_model_len=512, show_progress=False,
                         enable_prefix_caching=False)
               for name in (args.a, args.b)}
    ids = torch.randint(3, 32000, (128,), generator=torch.Generator().manual_seed(0)).tolist()
    results: dict[str, list[tuple[float, float]]] = {n: [] for n in engines}
    for name, llm in engines.items():
        p1(llm, ids[:16], 4, f"warm-{name}")
    for r in range(args.rounds):
        for name, llm in engines.items():
            results[name].append(p1(llm, ids, args.output_len, f"{name}-{r}"))
    for name, runs in results.items():
        ttft = statistics.median(t for t, _ in runs)
        tps = statistics.median(d for _, d in runs)
        print(f"{name:8s} {args.dtype:8s} threads={torch.get_num_threads()} "
              f"TTFT {ttft:8.1f} ms  decode {tps:6.3f} tok/s  runs={runs}")


if __name__ == "__main__":
    main()
