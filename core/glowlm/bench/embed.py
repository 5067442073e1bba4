"""``glowlm bench embed``: embedding throughput, sequences/s and tokens/s per batch size.

Each round embeds ``batch`` inputs of exactly ``--input-len`` random token ids (no
tokenizer in the timing) through the pooling engine, one engine step per batch (the
token budget is raised to fit the largest batch); the median round is reported. With
``--peer sentence-transformers`` the same token ids go through sentence-transformers'
own module pipeline (``SentenceTransformer.forward``, in the same dtype, one call per
batch), so both sides do the same work: encoder, pooling, normalization. Results go to
stdout, ``--output-json`` and, with ``--plot``, a PNG of sequences/s per batch size.
The vLLM CPU peer runs in its own venv (``tools/vllm_peer.py embed MODEL``, the same
token ids); ``--peer-results FILE`` puts the rows it printed beside glowlm's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from glowlm.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``glowlm bench embed``."""
    p.add_argument("model", help="a pooling model directory (BERT, XLM-R, Qwen3-Embedding...)")
    p.add_argument("--batch-sizes", default="1,32,256",
                   help="comma-separated batch sizes (default 1,32,256)")
    p.add_argument("--input-len", type=int, default=128, help="tokens per input (default 128)")
    p.add_argument("--dtype", default="bfloat16", help="model dtype (default bfloat16)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per batch (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    p.add_argument("--runner", default="pooling", help="--runner of the engine (default pooling)")
    p.add_argument("--convert", default="auto", help="--convert of the engine (default auto)")
    p.add_argument("--peer", action="append", default=[], choices=["sentence-transformers"],
                   help="also measure this peer on the same inputs (repeatable)")
    p.add_argument("--peer-results", metavar="FILE", action="append", default=[],
                   help="rows another harness measured on the same inputs (the JSON line "
                        "tools/vllm_peer.py embed prints), shown beside glowlm's")
    p.add_argument("--output-json", metavar="FILE", help="write the results here")
    p.add_argument("--plot", metavar="PNG", help="sequences/s per batch size (needs matplotlib)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def inputs(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``batch`` rows of ``length`` random token ids above the usual special tokens
    (BERT's [CLS]/[SEP]... sit at the start of the vocabulary)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(min(100, vocab // 2), vocab, (batch, length), generator=gen).tolist()


def _time_rounds(fn: Any, rounds: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _row(engine: str, batch: int, length: int, seconds: float) -> dict[str, Any]:
    return {"engine": engine, "batch_size": batch, "input_len": length, "seconds": seconds,
            "seqs_per_s": batch / seconds, "tokens_per_s": batch * length / seconds}


def _glowlm(args: argparse.Namespace, batches: list[int], inputs: list[list[int]]
            ) -> list[dict[str, Any]]:
    from glowlm.entrypoints.llm import LLM

    llm = LLM(args.model, runner=args.runner, convert=args.convert, dtype=args.dtype,
              max_num_batched_tokens=max(batches) * args.input_len,
              max_num_seqs=max(batches), show_progress=False)
    if llm.engine.max_model_len < args.input_len:
        raise ConfigError(f"--input-len {args.input_len} exceeds the model's maximum "
                          f"({llm.engine.max_model_len})")
    rows = []
    for b in batches:
        seconds = _time_rounds(lambda b=b: llm.embed(inputs[:b], use_tqdm=False),
                               args.rounds, args.warmup)
        rows.append(_row("glowlm", b, args.input_len, seconds))
    return rows


def _sentence_transformers(args: argparse.Namespace, batches: list[int],
                           inputs: list[list[int]]) -> list[dict[str, Any]]:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ConfigError("--peer sentence-transformers needs the sentence-transformers "
                          "package") from None
    st = SentenceTransformer(args.model, device="cpu")
    st = st.to(getattr(torch, args.dtype)).eval()
    rows = []
    for b in batches:
        ids = torch.tensor(inputs[:b])
        features = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                    "token_type_ids": torch.zeros_like(ids)}

        def once(f: dict[str, torch.Tensor] = features) -> None:
            with torch.inference_mode():
                st.forward(dict(f))["sentence_embedding"].float()

        rows.append(_row("sentence-transformers", b, args.input_len,
                         _time_rounds(once, args.rounds, args.warmup)))
    return rows


def _plot(rows: list[dict[str, Any]], path: str, title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = list(dict.fromkeys(r["engine"] for r in rows))
    batches = sorted({r["batch_size"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(engines)
    for k, engine in enumerate(engines):
        values = [next((r["seqs_per_s"] for r in rows if r["engine"] == engine
                        and r["batch_size"] == b), 0.0) for b in batches]
        ax.bar([i + k * width for i in range(len(batches))], values, width, label=engine)
    ax.set_xticks([i + width * (len(engines) - 1) / 2 for i in range(len(batches))])
    ax.set_xticklabels([f"batch {b}" for b in batches])
    ax.set_ylabel("sequences / s")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    try:
        batches = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    except ValueError:
        raise ConfigError(f"--batch-sizes {args.batch_sizes!r}: comma-separated integers") from None
    if not batches or min(batches) < 1 or args.input_len < 1 or args.rounds < 1:
        raise ConfigError("--batch-sizes, --input-len and --rounds must be positive")
    config = json.loads((Path(args.model) / "config.json").read_text())
    vocab = int(config.get("vocab_size", 1000))
    ids = inputs(max(batches), args.input_len, vocab, args.seed)
    rows = _glowlm(args, batches, ids)
    if "sentence-transformers" in args.peer:
        rows += _sentence_transformers(args, batches, ids)
    for path in args.peer_results:
        try:
            rows += json.loads(Path(path).read_text().strip().splitlines()[-1])["results"]
        except (OSError, ValueError, KeyError, IndexError) as exc:
            raise ConfigError(f"--peer-results {path}: not a peer's JSON line ({exc})") from None
    print(f"{args.model}: {args.dtype}, {args.input_len} tokens per input, median of "
          f"{args.rounds} rounds")
    for r in rows:
        print(f"  {r['engine']:<22} batch {r['batch_size']:>4}: {r['seqs_per_s']:10.1f} seq/s "
              f"{r['tokens_per_s']:12.0f} tok/s  ({r['seconds'] * 1e3:.1f} ms)")
    result = {"model": args.model, "dtype": args.dtype, "input_len": args.input_len,
              "rounds": args.rounds, "threads": torch.get_num_threads(), "results": rows}
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        _plot(rows, args.plot, f"embeddings, {args.input_len} tokens, {args.dtype}")
    return 0
