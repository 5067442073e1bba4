"""``glowlm models``: the default model, and the models in the Hugging Face cache."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("models", help="list the default model and cached models")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def cached_models() -> list[dict[str, object]]:
    """``ORG/NAME`` ids in the local Hugging Face cache (HF_HUB_CACHE / HF_HOME)."""
    from glowlm.model_loader.resolve import hf_cache_dir

    root = hf_cache_dir()
    out: list[dict[str, object]] = []
    if not root.is_dir():
        return out
    for d in sorted(root.glob("models--*")):
        snaps = sorted((d / "snapshots").glob("*")) if (d / "snapshots").is_dir() else []
        if not snaps:
            continue
        repo = d.name.removeprefix("models--").replace("--", "/", 1)
        files = {f.name for s in snaps for f in s.iterdir()}
        kind = "gguf" if any(f.endswith(".gguf") for f in files) else (
            "safetensors" if any(f.endswith(".safetensors") for f in files) else "other")
        out.append({"id": repo, "revisions": len(snaps), "format": kind})
    return out


def run(args: argparse.Namespace) -> int:
    from glowlm.default_model import describe
    from glowlm.model_loader.resolve import hf_cache_dir

    info = {"default": describe(), "hf_cache": str(hf_cache_dir()), "cached": cached_models()}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    d = info["default"]
    assert isinstance(d, dict)
    state = (f"{d['size_mb']} MB, {d['path']}" if d["installed"]
             else f"not installed: {d['install']}")
    print(f"{d['name']}  (default, used when MODEL is omitted; {d['format']}, "
          f"{d['license']}; {state})")
    cached = info["cached"]
    assert isinstance(cached, list)
    print(f"Hugging Face cache {info['hf_cache']}: "
          f"{len(cached)} model(s){':' if cached else ''}")
    for m in cached:
        print(f"  {m['id']}  ({m['format']}, {m['revisions']} revision(s))")
    return 0
