"""``glowlm bench lora``: P2 and batched decode with 0, 1, 4 and 16 adapters in one batch.

One engine with ``--enable-lora`` runs every case, alternating rounds, so the cases see
the same machine: the base model alone, then the same prompts spread round-robin over
N adapters (each request on one adapter, N different adapters in every batch). P2 is the
offline batch throughput (``--num-prompts`` prompts of ``--input-len`` random ids,
``--output-len`` tokens each, in one ``generate``); decode is the tokens/s of a batch of
``--decode-batch`` sequences after their prefill. The ratio to the base case is what an
adapter costs.

The adapters are ``--lora-modules`` when given, else random PEFT adapters of
``--lora-rank`` on every attention and MLP projection, written for the model in a
temporary directory (:func:`write_random_adapters`; real trained adapters cost the same:
the work is the rank, not the values). ``--json`` prints one object; ``--plot FILE.png``
draws the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from glowlm.entrypoints.cli.engine_args import add_engine_args

CASES = (0, 1, 4, 16)


def add_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("model", nargs="?", default=None,
                   help="model directory, .gguf file or ORG/NAME; default: SmolLM2-135M")
    q.add_argument("--input-len", type=int, default=128)
    q.add_argument("--output-len", type=int, default=128)
    q.add_argument("--num-prompts", type=int, default=32)
    q.add_argument("--decode-batch", type=int, default=16)
    q.add_argument("--decode-len", type=int, default=32)
    q.add_argument("--adapters", type=int, nargs="+", default=list(CASES), metavar="N",
                   help=f"adapters per batch to measure (default {' '.join(map(str, CASES))};"
                        " 0 is the base model alone)")
    q.add_argument("--lora-rank", type=int, default=16,
                   help="rank of the random adapters (default 16)")
    q.add_argument("--rounds", type=int, default=2, help="alternating rounds (best kept)")
    q.add_argument("--json", action="store_true")
    q.add_argument("--plot", type=Path, metavar="FILE.png")
    add_engine_args(q)
    q.set_defaults(func=run)


def write_random_adapters(engine: Any, out: Path, count: int, rank: int) -> list[Path]:
    """``count`` PEFT adapters of ``rank`` on every adapted projection of ``engine``'s
    model, named as the checkpoint names them (fused layers split back by shard)."""
    import torch
    from safetensors.torch import save_file

    model = engine.setup.model
    stacked = list(getattr(model, "stacked_params", []))
    modules: dict[str, tuple[int, int]] = {}
    for prefix, layer in engine.lora.layers.items():
        head, _, leaf = prefix.rpartition(".")
        sizes = layer.checkpoint_sizes() if hasattr(layer, "checkpoint_sizes") else [
            sum(layer.output_sizes)]
        parts = [(p, sid) for f, p, sid in stacked if f == leaf]
        full_in = layer.full_input_size
        if parts:
            for part, sid in parts:
                modules[f"{head}.{part}"] = (full_in, sizes[layer.shard_index(sid)])
        else:
            modules[prefix] = (full_in, sum(sizes))
    paths = []
    g = torch.Generator().manual_seed(0)
    for i in range(count):
        d = out / f"lora{i}"
        d.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for name, (n_in, n_out) in modules.items():
            key = f"base_model.model.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, n_in, generator=g) / n_in ** 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, rank, generator=g) * 0.01
        save_file(tensors, str(d / "adapter_model.safetensors"))
        (d / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
            "target_modules": sorted({n.rsplit(".", 1)[-1] for n in modules})}))
        paths.append(d)
    return paths


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[dict[str, list[int]]]:
    import random

    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(10, vocab - 1) for _ in range(length)]}
            for _ in range(n)]


def _run(engine: Any, prompts: list[Any], params: Any, loras: list[Any]) -> tuple[float, int]:
    """Seconds to finish every prompt in one batch, and output tokens."""
    t0 = time.perf_counter()
    for i, (p, lora) in enumerate(zip(prompts, loras, strict=True)):
        engine.add_request(f"b{time.monotonic_ns()}-{i}", p, params, lora_request=lora)
    tokens = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens += sum(len(c.token_ids) for c in out.outputs)
    return time.perf_counter() - t0, tokens


def _decode_rate(engine: Any, prompts: list[Any], length: int, loras: list[Any]) -> float:
    """Tokens/s of the batch's decode steps (prefill excluded)."""
    from glowlm.sampling.params import SamplingParams

    params = SamplingParams(max_tokens=length, temperature=0.0, ignore_eos=True)
    for i, (p, lora) in enumerate(zip(prompts, loras, strict=True)):
        engine.add_request(f"d{time.monotonic_ns()}-{i}", p, params, lora_request=lora)
    t0 = None
    tokens = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        if t0 is None:
            if all(len(o.outputs[0].token_ids) >= 1 for o in outs) and len(outs) == len(prompts):
                t0 = time.perf_counter()  # every sequence has its first token
            continue
        tokens += len(outs)
    assert t0 is not None
    return tokens / (time.perf_counter() - t0)


def run(args: argparse.Namespace) -> int:
    from glowlm.bench.offline import build_engine, context
    from glowlm.lora.request import LoRARequest, from_modules
    from glowlm.sampling.params import SamplingParams

    wanted = max(args.adapters)
    args.enable_lora = True
    if args.max_loras is None:
        args.max_loras = max(1, wanted)
    if args.max_lora_rank is None:
        args.max_lora_rank = max(16, args.lora_rank)
    engine = build_engine(args)
    tmp = tempfile.TemporaryDirectory(prefix="glowlm-bench-lora-")
    if args.lora_modules:
        loras = from_modules(args.lora_modules)
    else:
        print(f"writing {wanted} random rank-{args.lora_rank} adapters", file=sys.stderr)
        loras = [LoRARequest(p.name, i + 1, str(p)) for i, p in enumerate(
            write_random_adapters(engine, Path(tmp.name), wanted, args.lora_rank))]
    if len(loras) < wanted:
        raise SystemExit(f"glowlm bench lora: --adapters {wanted} needs {wanted} adapters, "
                         f"--lora-modules gives {len(loras)}")
    for lora in loras:
        engine.add_lora(lora)
    vocab = engine.vocab_size
    prompts = _prompts(args.num_prompts, args.input_len, vocab, 1)
    dprompts = _prompts(args.decode_batch, args.input_len, vocab, 2)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)

    def spread(n: int, count: int) -> list[Any]:
        return [None if n == 0 else loras[i % n] for i in range(count)]

    _run(engine, prompts[:2], SamplingParams(max_tokens=2), [None, loras[0]])  # warm-up
    p2: dict[int, list[float]] = {n: [] for n in args.adapters}
    dec: dict[int, list[float]] = {n: [] for n in args.adapters}
    for r in range(args.rounds):
        for n in args.adapters:
            print(f"round {r + 1}/{args.rounds}: {n} adapter(s)", file=sys.stderr)
            seconds, tokens = _run(engine, prompts, params, spread(n, len(prompts)))
            p2[n].append(tokens / seconds)
            dec[n].append(_decode_rate(engine, dprompts, args.decode_len,
                                       spread(n, len(dprompts))))
    base = 0 if 0 in args.adapters else None
    rows = []
    for n in args.adapters:
        row: dict[str, Any] = {"adapters": n, "p2_output_tokens_per_s": round(max(p2[n]), 2),
                               "decode_tokens_per_s": round(max(dec[n]), 2),
                               "p2_rounds": [round(v, 2) for v in p2[n]]}
        if base is not None:
            row["p2_vs_base"] = round(max(p2[n]) / max(p2[base]), 3)
            row["decode_vs_base"] = round(max(dec[n]) / max(dec[base]), 3)
        rows.append(row)
    result = {"case": "lora", **context(engine),
              "lora_rank": None if args.lora_modules else args.lora_rank,
              "input_len": args.input_len, "output_len": args.output_len,
              "num_prompts": args.num_prompts, "decode_batch": args.decode_batch,
              "max_loras": engine.config.max_loras, "rows": rows,
              "p2_median_spread": round(statistics.median(
                  (max(v) - min(v)) / max(v) for v in p2.values()), 3)}
    if args.plot:
        _plot(rows, args.plot, f"{Path(str(engine.config.model)).name}, "
              f"{result['dtype']}, rank {args.lora_rank}")
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            if key != "rows":
                print(f"{key:>22}: {value}")
        for row in rows:
            print(f"{row['adapters']:>3} adapters: P2 {row['p2_output_tokens_per_s']:8.2f} "
                  f"tok/s ({row.get('p2_vs_base', 1):.3f}x base), decode "
                  f"{row['decode_tokens_per_s']:8.2f} tok/s "
                  f"({row.get('decode_vs_base', 1):.3f}x)")
    tmp.cleanup()
    return 0


def _plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["base" if r["adapters"] == 0 else f"{r['adapters']} LoRA" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, name in ((axes[0], "p2_output_tokens_per_s", "P2 output tok/s"),
                          (axes[1], "decode_tokens_per_s", "batched decode tok/s")):
        ax.bar(labels, [r[key] for r in rows], color="#4a7bb7")
        ax.set_title(name)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
