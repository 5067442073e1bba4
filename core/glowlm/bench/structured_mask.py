"""What structured outputs cost per decode step: ``glowlm bench structured-mask``.

Per step and constrained row: llguidance's bitmask (``fill_bitmask``, which
also consumes the token sampled last step), its unpacking to a ``[rows,
vocab]`` bool mask and the ``masked_fill`` on the logits. The grammar is a
JSON schema; each step samples uniformly among the allowed tokens, so the
walk goes through keys, strings, numbers and nesting like a real output.
Prints one line per phase (median and p90 in microseconds).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                 "maxItems": 4},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "zip": {"type": "string",
                                                             "pattern": "[0-9]{5}"}},
                    "required": ["city", "zip"]},
    },
    "required": ["name", "age", "tags", "address"],
}


@dataclass(eq=False)
class _Request:
    eos_token_ids: frozenset[int]


@dataclass(eq=False)
class _Row:
    request: _Request
    output_token_ids: list[int] = field(default_factory=list)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``glowlm bench structured-mask``."""
    p.add_argument("--tokenizer", help="tokenizer directory (default: the default model's)")
    p.add_argument("--rows", type=int, default=8, help="constrained rows per step (default 8)")
    p.add_argument("--steps", type=int, default=64, help="decode steps (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="glowlm bench structured-mask",
                                description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoTokenizer

    from glowlm.sampling.params import StructuredOutputsParams
    from glowlm.sampling.structured import GrammarEngine, bitmask_to_bool, grammar_of

    path = args.tokenizer
    if path is None:
        from glowlm import default_model

        path = str(default_model.default_model_path())
    if path.endswith(".gguf"):  # the default model ships as one GGUF file
        from pathlib import Path

        tok: Any = AutoTokenizer.from_pretrained(str(Path(path).parent),
                                                 gguf_file=Path(path).name)
    else:
        tok = AutoTokenizer.from_pretrained(path)
    vocab = len(tok)
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else [0]
    t0 = time.perf_counter()
    engine = GrammarEngine(tok, vocab, eos)
    setup = time.perf_counter() - t0
    spec = StructuredOutputsParams(json=SCHEMA)
    t0 = time.perf_counter()
    spec.compiled = grammar_of(spec)
    compile_s = time.perf_counter() - t0
    rng = random.Random(args.seed)
    rows = [_Row(_Request(frozenset(eos))) for _ in range(args.rows)]
    specs = [spec] * args.rows
    logits = torch.randn(args.rows, vocab)
    fill, unpack, apply = [], [], []
    for step in range(args.steps + 1):  # step 0 creates the matchers: reported apart
        bitmask = torch.full((args.rows, engine.words), -1, dtype=torch.int32)
        t0 = time.perf_counter()
        engine.fill_bitmask(rows, specs, bitmask)
        t1 = time.perf_counter()
        allowed = bitmask_to_bool(bitmask, vocab)
        t2 = time.perf_counter()
        masked = logits.masked_fill(~allowed, float("-inf"))
        t3 = time.perf_counter()
        if step == 0:
            first = t1 - t0
        else:
            fill.append((t1 - t0) / args.rows * 1e6)
            unpack.append((t2 - t1) * 1e6)
            apply.append((t3 - t2) * 1e6)
        for i, row in enumerate(rows):
            ok = allowed[i].nonzero().flatten().tolist()
            token = rng.choice(ok) if ok else eos[0]
            if token not in eos:
                row.output_token_ids.append(token)
        del masked
    print(f"tokenizer {path}: vocab {vocab}; llguidance tokenizer built in {setup:.2f} s, "
          f"schema compiled in {compile_s * 1e3:.1f} ms")
    print(f"first step (creates {args.rows} matchers): {first * 1e3:.1f} ms")
    print(f"{args.rows} constrained rows x {args.steps} steps:")
    for name, values, unit in (("grammar bitmask", fill, "per row"),
                               ("unpack to bool mask", unpack, "per step"),
                               ("masked_fill on logits", apply, "per step")):
        print(f"  {name:<22} median {statistics.median(values):8.1f} us  "
              f"p90 {_pct(values, 0.9):8.1f} us  ({unit})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
