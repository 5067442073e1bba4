"""The shared benchmark protocol's cases, measured through the engine.

P1: one prompt of ``input_len`` ids drawn with ``torch.Generator().manual_seed(0)``
from ``[3, vocab)``, exactly ``output_len`` greedy tokens; time to first token
and decode speed over the tokens after the first; one warm-up, median of 3.
P2: ``num_prompts`` prompts (seed 1, request i takes the i-th draw) submitted at
once, exactly ``output_len`` tokens each.

With a prompt of the user's (``prompt=``, speculative decoding's text prompts), P1 runs
greedy until EOS or ``output_len`` and counts the tokens it got; every run reports its
tokens, so a speculative run can be checked token for token against the plain one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from glowlm.engine.llm_engine import LLMEngine
from glowlm.runtime import hugepages
from glowlm.sampling.params import SamplingParams


def random_prompts(num: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(num)]


@dataclass
class LatencyResult:
    ttft_ms: float
    decode_tokens_per_s: float
    overhead_fraction: float          # share of decode step time outside the model forward
    runs: list[dict[str, float]] = field(default_factory=list)


def _forced(output_len: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=output_len, min_tokens=output_len,
                          ignore_eos=True)


def _one_latency_run(engine: LLMEngine, prompt: list[int], output_len: int, tag: str,
                     exact: bool = True) -> dict[str, float]:
    params = _forced(output_len) if exact else SamplingParams(temperature=0,
                                                              max_tokens=output_len)
    engine.add_request(tag, {"prompt_token_ids": prompt}, params)
    start = time.perf_counter()
    first = None
    decode_forward = decode_total = 0.0
    decode_steps = 0
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        s0 = engine.stats.forward_seconds
        t0 = time.perf_counter()
        outs = engine.step()
        if outs:
            tokens = outs[0].outputs[0].token_ids
        if first is None:
            first = time.perf_counter()
        else:
            decode_steps += 1
            decode_total += time.perf_counter() - t0
            decode_forward += engine.stats.forward_seconds - s0
    end = time.perf_counter()
    assert first is not None
    n = len(tokens)
    return {"ttft_ms": (first - start) * 1e3,
            "decode_tokens_per_s": (n - 1) / (end - first) if n > 1 else 0.0,
            "overhead_fraction": 1 - decode_forward / decode_total if decode_total else 0.0,
            "output_tokens": n, "decode_steps": decode_steps,
            "token_ids": list(tokens)}  # type: ignore[dict-item]


def measure_latency(engine: LLMEngine, input_len: int, output_len: int, batch_size: int = 1,
                    iters: int = 3, warmup: int = 1,
                    between: Callable[[], object] | None = None,
                    prompt: list[int] | None = None) -> LatencyResult:
    """P1. ``between`` runs before every measured run and after the last one (the
    roofline samples the read bandwidth there, so each run is held against the
    bandwidth of its own minute). ``prompt``: the user's (one stream, until EOS)."""
    prompts = ([prompt] if prompt is not None
               else random_prompts(batch_size, input_len, engine.vocab_size, seed=0))
    runs = []
    for i in range(warmup + iters):
        if between is not None and i >= warmup:
            between()
        if batch_size == 1 or prompt is not None:
            run = _one_latency_run(engine, prompts[0], output_len, f"p1-{i}",
                                   exact=prompt is None)
        else:
            run = _batched_latency_run(engine, prompts, output_len, f"p1-{i}")
        if i >= warmup:
            runs.append(run)
    if between is not None:
        between()
    return LatencyResult(
        ttft_ms=statistics.median(r["ttft_ms"] for r in runs),
        decode_tokens_per_s=statistics.median(r["decode_tokens_per_s"] for r in runs),
        overhead_fraction=statistics.median(r["overhead_fraction"] for r in runs), runs=runs)


def _batched_latency_run(engine: LLMEngine, prompts: list[list[int]], output_len: int,
                         tag: str) -> dict[str, float]:
    for j, p in enumerate(prompts):
        engine.add_request(f"{tag}-{j}", {"prompt_token_ids": p}, _forced(output_len))
    start = time.perf_counter()
    first = None
    f_total = t_total = 0.0
    decode_steps = 0
    tokens_of: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        s0, t0 = engine.stats.forward_seconds, time.perf_counter()
        outs = engine.step()
        for o in outs:
            tokens_of[o.request_id] = o.outputs[0].token_ids
        if first is None and outs and all(o.outputs[0].token_ids for o in outs):
            first = time.perf_counter()
        elif first is not None:
            decode_steps += 1
            t_total += time.perf_counter() - t0
            f_total += engine.stats.forward_seconds - s0
    end = time.perf_counter()
    first = first or end
    tokens = (output_len - 1) * len(prompts)
    # Per sequence (speculative.compare: tokens per decode step), and every request's
    # tokens in prompt order (its identity check against the plain run).
    return {"ttft_ms": (first - start) * 1e3,
            "decode_tokens_per_s": tokens / (end - first) if end > first else 0.0,
            "overhead_fraction": 1 - f_total / t_total if t_total else 0.0,
            "output_tokens": output_len, "decode_steps": decode_steps,
            "token_ids": [t for j in range(len(prompts))  # type: ignore[dict-item]
                          for t in tokens_of.get(f"{tag}-{j}", [])]}


@dataclass
class ThroughputResult:
    elapsed_s: float
    num_prompts: int
    output_tokens_per_s: float
    total_tokens_per_s: float
    requests_per_s: float


def measure_throughput(engine: LLMEngine, input_len: int, output_len: int, num_prompts: int,
                       shared_prefix_len: int = 0) -> ThroughputResult:
    """P2; with ``shared_prefix_len``, every prompt starts with the same random prefix
    (seed 2) before its own ``input_len`` ids, as in few-shot or system-prompt serving."""
    prompts = random_prompts(num_prompts, input_len, engine.vocab_size, seed=1)
    if shared_prefix_len:
        prefix = random_prompts(1, shared_prefix_len, engine.vocab_size, seed=2)[0]
        prompts = [prefix + p for p in prompts]
        input_len += shared_prefix_len
    for i, p in enumerate(prompts):
        engine.add_request(f"p2-{i}", {"prompt_token_ids": p}, _forced(output_len))
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    elapsed = time.perf_counter() - start
    out_tokens = num_prompts * output_len
    return ThroughputResult(elapsed, num_prompts, out_tokens / elapsed,
                            (out_tokens + num_prompts * input_len) / elapsed,
                            num_prompts / elapsed)


@dataclass(frozen=True)
class Bandwidth:
    """Read bandwidth samples in GB/s: the median (the roofline's basis) and the best."""

    median_gbs: float
    best_gbs: float


def read_bandwidth(gib: float = 1.0, repeats: int = 9, huge_pages: bool = False) -> Bandwidth:
    """Memory read bandwidth with all threads: ``repeats`` sums over a large array.

    The median is the basis of the roofline because decode speed is a median too: on
    a shared VM single reads vary by +-20 % (25-38 GB/s within one second here), and
    the best sample would set a bar that no sustained read meets. ``huge_pages``
    reads an array in 2 MiB pages (where THP allows advising them), as the engine's
    weights are; 4 KiB pages read measurably slower (docs/runtime.md).
    """
    n = int(gib * (1 << 30)) // 4
    if huge_pages and hugepages.available():
        x = hugepages.huge_buffer(n * 4).view(torch.float32)
        x.fill_(1.0)
    else:
        x = torch.ones(n, dtype=torch.float32)
    x.sum()  # fault the pages in and warm up
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        x.sum()
        samples.append(x.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return Bandwidth(statistics.median(samples), max(samples))
