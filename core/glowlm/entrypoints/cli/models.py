"""``glowlm models``: the embedded default model, its size and evaluation figures."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("models", help="list the embedded default model")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from glowlm.default_model import describe

    info = describe()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['name']}  (embedded default; used when MODEL is omitted)")
    print(f"  path: {info['path']}")
    print(f"  size: {info['size_mb']} MB on disk")
    train = info.get("training_info") or {}
    if train:
        print(f"  parameters: {train.get('params', '?'):,}; trained "
              f"{train.get('train_minutes', '?')} min on {train.get('tokens_seen', '?'):,} "
              "tokens of the Python standard library")
    ev = info.get("eval") or {}
    if ev:
        print(f"  held-out perplexity {ev['heldout_ppl']} (unigram baseline "
              f"{ev['unigram_ppl']}); completions that parse: {ev['parse_rate']:.0%} of "
              f"{ev['functions_evaluated']} held-out function headers")
    return 0
