"""Per-decode-step time split (prepare / forward / sample / rest) from LLMEngine.stats.

Usage: python tools/x86/step_overhead.py MODEL [--platform x86] [--dtype float32]
Runs one P1 request (128 random prompt ids, 128 forced output tokens) after a
warm-up and prints milliseconds per decode step for each phase. "rest" is the
step time not inside the runner (scheduling, detokenization, output building).
"""

from __future__ import annotations

import argparse

import torch
from glowlm import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--platform", default="x86")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()
    llm = LLM(args.model, platform=args.platform, dtype=args.dtype, block_size=32,
              kv_cache_space_gib=0.5, max_model_len=1024, show_progress=False)
    engine = llm.engine
    ids = torch.randint(3, engine.vocab_size, (128,),
                        generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    for tag in ("warm", "run"):
        engine.add_request(tag, {"prompt_token_ids": ids}, params)
        engine.step()  # prefill (+ first token)
        if tag == "run":
            before = dict(vars(engine.stats))
        while engine.has_unfinished_requests():
            engine.step()
    s = vars(engine.stats)
    steps = s["steps"] - before["steps"]
    ms = {k: (s[k] - before[k]) / steps * 1e3
          for k in ("prepare_seconds", "forward_seconds", "sample_seconds", "step_seconds")}
    rest = ms["step_seconds"] - ms["prepare_seconds"] - ms["forward_seconds"] \
        - ms["sample_seconds"]
    print(f"{args.platform} {args.dtype} threads={torch.get_num_threads()} "
          f"decode steps={steps}: step {ms['step_seconds']:.2f} ms = forward "
          f"{ms['forward_seconds']:.2f} + prepare {ms['prepare_seconds']:.2f} + sample "
          f"{ms['sample_seconds']:.2f} + rest {rest:.2f} "
          f"(non-forward {100 * (1 - ms['forward_seconds'] / ms['step_seconds']):.1f}%)")


if __name__ == "__main__":
    main()
