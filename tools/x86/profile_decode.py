"""Time one prefill, then profile a few decode steps of glowlm.LLM (top ops by self CPU time).

Usage: python tools/x86/profile_decode.py MODEL [--platform x86] [--dtype bfloat16]
       [--threads N] [--input-len 128] [--steps 4]
"""

from __future__ import annotations

import argparse
import time

import torch
from glowlm import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--platform", default="x86")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rows", type=int, default=15)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    llm = LLM(args.model, platform=args.platform, dtype=args.dtype, block_size=32,
              kv_cache_space_gib=0.5, max_model_len=1024, show_progress=False)
    engine = llm.engine
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 32000, (args.input_len,), generator=g).tolist()
    params = SamplingParams(temperature=0, max_tokens=args.steps + 2, ignore_eos=True)
    engine.add_request("warm", {"prompt_token_ids": ids[:8]}, params)
    while engine.has_unfinished_requests():
        engine.step()
    engine.add_request("p", {"prompt_token_ids": ids}, params)
    t0 = time.perf_counter()
    engine.step()
    t1 = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            engine.step()
        t2 = time.perf_counter()
    print(f"threads={torch.get_num_threads()} prefill {t1 - t0:.3f} s, "
          f"decode {(t2 - t1) / args.steps * 1e3:.1f} ms/step")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
