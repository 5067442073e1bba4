"""``glowlm models``: the default model, and the models in the Hugging Face cache.

The cache is read and pruned through huggingface_hub (``scan_cache_dir`` and its
deletion strategy), so ``glowlm models --delete`` removes exactly what ``hf cache``
would: the repo's snapshots, refs and the blobs no other revision shares. For every
cached revision it says whether glowlm can load it (a whole snapshot of a known
architecture, or GGUF files), by the same checks ``glowlm serve`` makes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from glowlm.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "models",
        help="list the default model and the models in the Hugging Face cache; "
        "--delete ID removes one",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--delete",
        metavar="ID",
        help="remove ORG/NAME (every cached revision) from the Hugging Face cache",
    )
    p.add_argument(
        "-y", "--yes", action="store_true", help="with --delete: do not ask for confirmation"
    )
    p.set_defaults(func=run)


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB"


def revision_status(repo_id: str, snapshot: Path) -> dict[str, Any]:
    """What a cached snapshot is (safetensors / gguf) and whether glowlm loads it."""
    from glowlm.model_loader.resolve import check_snapshot

    ggufs = sorted(p.name for p in snapshot.rglob("*.gguf"))
    config = snapshot / "config.json"
    out: dict[str, Any] = {
        "format": "safetensors" if config.is_file() else ("gguf" if ggufs else "other"),
        "loadable": False,
        "problem": None,
    }
    if out["format"] == "gguf":
        out.update(gguf_files=ggufs, loadable=True)
        return out
    try:
        check_snapshot(repo_id, snapshot)
        from glowlm.models.registry import model_class

        model_class(json.loads(config.read_text()).get("architectures"))
        out["loadable"] = True
    except Exception as exc:  # noqa: BLE001 - every reason is reported, none is fatal
        out["problem"] = str(exc).split("\n")[0]
    return out


def cached_models() -> list[dict[str, Any]]:
    """Model repos in the local Hugging Face cache (HF_HUB_CACHE / HF_HOME), newest
    revision first, each with its refs, size on disk and whether glowlm loads it."""
    from huggingface_hub import scan_cache_dir

    from glowlm.model_loader.resolve import hf_cache_dir

    root = hf_cache_dir()
    if not root.is_dir():
        return []
    info = scan_cache_dir(root)
    out: list[dict[str, Any]] = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        revisions = []
        for rev in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            revisions.append(
                {
                    "commit": rev.commit_hash,
                    "refs": sorted(rev.refs),
                    "size_on_disk": rev.size_on_disk,
                    **revision_status(repo.repo_id, Path(rev.snapshot_path)),
                }
            )
        incomplete = sum(
            f.size_on_disk
            for f in info.incomplete_files
            if Path(repo.repo_path) in Path(f.file_path).parents
        )
        out.append(
            {
                "id": repo.repo_id,
                "revisions": len(revisions),
                "format": revisions[0]["format"] if revisions else "other",
                "size_on_disk": repo.size_on_disk,
                "incomplete_bytes": incomplete,
                "path": str(repo.repo_path),
                "revision_list": revisions,
            }
        )
    return out


def delete_model(repo_id: str, yes: bool) -> int:
    """Remove ``repo_id`` from the cache with huggingface_hub's deletion strategy."""
    from huggingface_hub import scan_cache_dir

    from glowlm.model_loader.resolve import hf_cache_dir

    root = hf_cache_dir()
    info = scan_cache_dir(root) if root.is_dir() else None
    repos = [r for r in (info.repos if info else []) if r.repo_type == "model"]
    found = [r for r in repos if r.repo_id == repo_id]
    if not found or info is None:
        ids = ", ".join(sorted(r.repo_id for r in repos)) or "none"
        raise ConfigError(
            f"--delete {repo_id}: not in the Hugging Face cache {root} (cached models: {ids})"
        )
    repo = found[0]
    strategy = info.delete_revisions(*(r.commit_hash for r in repo.revisions))
    what = (
        f"{repo_id} ({len(repo.revisions)} revision(s), "
        f"{_mb(strategy.expected_freed_size)}) from {root}"
    )
    if not yes:
        print(f"delete {what}? [y/N] ", end="", flush=True)
        answer = sys.stdin.readline().strip().lower()  # "" at end of input: no
        if answer not in ("y", "yes"):
            print("nothing deleted (answer y, or pass --yes)")
            return 1
    strategy.execute()
    print(f"deleted {what}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.delete:
        return delete_model(args.delete, args.yes)
    from glowlm.default_model import describe
    from glowlm.model_loader.resolve import hf_cache_dir

    info = {"default": describe(), "hf_cache": str(hf_cache_dir()), "cached": cached_models()}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    d = info["default"]
    assert isinstance(d, dict)
    state = (
        f"{d['size_mb']} MB, {d['path']}" if d["installed"] else f"not installed: {d['install']}"
    )
    print(
        f"{d['name']}  (default, used when MODEL is omitted; {d['format']}, "
        f"{d['license']}; {state})"
    )
    cached = info["cached"]
    assert isinstance(cached, list)
    print(f"Hugging Face cache {info['hf_cache']}: {len(cached)} model(s){':' if cached else ''}")
    for m in cached:
        partial = (
            f", {_mb(m['incomplete_bytes'])} of an unfinished download (resumes on the next start)"
            if m["incomplete_bytes"]
            else ""
        )
        print(
            f"  {m['id']}  ({m['format']}, {m['revisions']} revision(s), "
            f"{_mb(m['size_on_disk'])}{partial})"
        )
        for r in m["revision_list"]:
            refs = ",".join(r["refs"]) or "-"
            if r["loadable"]:
                state = "loadable" + (
                    f": {', '.join(r['gguf_files'])}" if r.get("gguf_files") else ""
                )
            else:
                state = f"not loadable: {r['problem']}"
            print(f"      {refs:<8} {r['commit'][:12]}  {_mb(r['size_on_disk']):>9}  {state}")
    return 0
