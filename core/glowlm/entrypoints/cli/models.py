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
        params = train.get("params") or train.get("parameters")
        print(f"  parameters: {params}; trained {train.get('minutes', '?')} min on "
              f"{train.get('tokens_seen', '?')} tokens of the Python standard library")
    ev = info.get("eval") or {}
    for key, value in ev.items():
        if not isinstance(value, dict | list):
            print(f"  {key}: {value}")
    return 0
