"""Hugging Face transformers on the same model, threads and protocol, for ratios."""

from __future__ import annotations

import statistics
import time

import torch

from glowlm.bench.protocol import random_prompts


def _load(model_dir: str, dtype: torch.dtype):  # noqa: ANN202
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()


@torch.inference_mode()
def hf_latency(model_dir: str, dtype: torch.dtype, input_len: int, output_len: int,
               vocab: int, iters: int = 3) -> dict[str, float]:
    model = _load(model_dir, dtype)
    ids = torch.tensor(random_prompts(1, input_len, vocab, seed=0))
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    ttfts, decodes = [], []
    for i in range(iters + 1):
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        ttft = time.perf_counter() - t
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len, **kw)
        total = time.perf_counter() - t
        if i:
            ttfts.append(ttft * 1e3)
            decodes.append((output_len - 1) / max(total - ttft, 1e-9))
    return {"ttft_ms": statistics.median(ttfts),
            "decode_tokens_per_s": statistics.median(decodes)}


@torch.inference_mode()
def hf_throughput(model_dir: str, dtype: torch.dtype, input_len: int, output_len: int,
                  num_prompts: int, vocab: int) -> dict[str, float]:
    """A padded batch of ``num_prompts`` through ``generate`` (all prompts equal length)."""
    model = _load(model_dir, dtype)
    ids = torch.tensor(random_prompts(num_prompts, input_len, vocab, seed=1))
    t = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=output_len,
                   min_new_tokens=output_len, do_sample=False, eos_token_id=None, pad_token_id=0)
    elapsed = time.perf_counter() - t
    out = num_prompts * output_len
    return {"output_tokens_per_s": out / elapsed,
            "total_tokens_per_s": (out + num_prompts * input_len) / elapsed}
