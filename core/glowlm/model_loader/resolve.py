"""What the user typed as MODEL -> the files glowlm reads.

One function, :func:`resolve_model`, answers for every entry point (``LLM(...)``,
``glowlm generate``, ``serve``, ``bench``) and every rank, in this order:

1. nothing: the default model (:mod:`glowlm.default_model`);
2. a ``.gguf`` file: that file;
3. a directory: a Hugging Face directory (``config.json`` + weights), or the one GGUF
   file it holds, or the one ``gguf_file`` names when it holds several;
4. ``ORG/NAME`` (or ``ORG/NAME:QUANT`` for one GGUF file of the repo) that is not a
   local path: the Hugging Face cache (``HF_HUB_CACHE``, ``HF_HOME``) at ``revision``.

Resolution never touches the network: the entry points download a missing model once,
before the engine starts (:func:`glowlm.model_loader.hub.fetch_model`), and pin the
revision to the commit they fetched, so the ranks and every later look-up read the
same snapshot from the cache. A snapshot missing a file it should hold (a download
that did not finish) is refused, never loaded. Every miss is one
:class:`~glowlm.errors.ModelLoadError` line that says where glowlm looked and what to do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from glowlm.errors import ModelLoadError
from glowlm.model_loader.hub_files import missing_files, pick_gguf, plan_files, split_spec


@dataclass(frozen=True)
class ModelSource:
    """Where a model's metadata and weights are."""

    spec: str  # what the user gave
    path: Path  # a directory with config.json and the tokenizer
    gguf_file: Path | None  # the weights, when they are a GGUF file
    origin: str  # "directory", "gguf", "hf-cache" or "default"

    def describe(self) -> str:
        where = self.gguf_file or self.path
        return f"{self.spec} ({where})" if str(where) != self.spec else str(where)


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment at call time."""
    from glowlm import envs

    return Path(envs.hub().cache_dir)


def cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The cached snapshot directory of ``repo_id`` at ``revision`` (a branch or tag
    through the cache's refs, or a commit), or None; no network."""
    from huggingface_hub import snapshot_download

    try:
        # Only config.json is checked here; what else a snapshot must hold is glowlm's
        # plan (check_snapshot), not the whole repo's listing.
        return Path(
            snapshot_download(
                repo_id,
                revision=revision,
                cache_dir=str(hf_cache_dir()),
                local_files_only=True,
                allow_patterns="config.json",
            )
        )
    except Exception as exc:  # noqa: BLE001 - LocalEntryNotFoundError, IncompleteSnapshotError
        if type(exc).__name__ == "IncompleteSnapshotError":
            path = getattr(exc, "snapshot_path", None)
            return Path(path) if path else None
        return None


def _incomplete(repo_id: str, snapshot: Path, missing: list[str]) -> ModelLoadError:
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    return ModelLoadError(
        f"the cached snapshot of {repo_id} (commit {snapshot.name[:12]}, {snapshot}) is "
        f"incomplete: {', '.join(missing[:3])}{more} missing (a download that did not "
        f"finish); start glowlm online to resume it, or remove it with "
        f"`glowlm models --delete {repo_id}`"
    )


def check_snapshot(
    repo_id: str, snapshot: Path, tag: str | None = None, gguf_file: str | None = None
) -> Path | None:
    """Check a cached snapshot holds a whole model; return its GGUF file, or None for a
    Hugging Face checkpoint. The files it must hold come from the repo's tree listing
    that huggingface_hub cached with the download (else the snapshot's own files).
    Raises :class:`ModelLoadError` naming what is missing."""
    present = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    listing = present
    try:
        from huggingface_hub import get_cached_repo_tree

        listing = [
            f.path
            for f in get_cached_repo_tree(
                repo_id, revision=snapshot.name, cache_dir=str(hf_cache_dir())
            )
        ]
    except Exception:  # noqa: BLE001 - CachedRepoTreeNotFoundError: a cache made elsewhere
        pass
    try:
        plan = plan_files(listing, tag=tag, gguf_file=gguf_file, allow_pickle=True, where=repo_id)
    except ModelLoadError:
        if listing is present:
            raise
        plan = plan_files(present, tag=tag, gguf_file=gguf_file, allow_pickle=True, where=repo_id)
    if plan.gguf_file is not None:
        # A GGUF repo's snapshot holds the files that were asked for: choose among those.
        ggufs = [f for f in present if f.lower().endswith(".gguf")]
        if not ggufs:
            raise _incomplete(repo_id, snapshot, [plan.gguf_file])
        if (tag or gguf_file) and plan.gguf_file not in present:
            raise ModelLoadError(
                f"{plan.gguf_file} of {repo_id} is not in the Hugging Face cache ({snapshot} "
                f"holds {', '.join(ggufs)}); start glowlm online (without --offline / "
                "HF_HUB_OFFLINE) to download it"
            )
        return snapshot / pick_gguf(ggufs, tag, gguf_file, repo_id)
    missing = missing_files(snapshot, plan)
    if missing:
        raise _incomplete(repo_id, snapshot, missing)
    return None


def _from_hf_cache(
    spec: str, repo_id: str, tag: str | None, revision: str | None, gguf_file: str | None
) -> ModelSource:
    snapshot = cached_snapshot(repo_id, revision)
    if snapshot is None:
        at = f" at revision {revision}" if revision else ""
        raise ModelLoadError(
            f"model {repo_id}{at} is neither a local path nor in the Hugging Face cache "
            f"({hf_cache_dir()}; set HF_HUB_CACHE or HF_HOME to look elsewhere), and glowlm "
            f"is offline (HF_HUB_OFFLINE=1 or --offline; online it downloads it): on a "
            f"connected machine run `hf download {repo_id}` and copy that cache here, or "
            "pass a local directory or .gguf file"
        )
    chosen = check_snapshot(repo_id, snapshot, tag, gguf_file)
    if chosen is not None:
        return _gguf_source(spec, chosen, "hf-cache")
    return ModelSource(spec, snapshot, None, "hf-cache")


def _pick_gguf(directory: Path, gguf_file: str | None) -> Path | None:
    files = sorted(directory.glob("*.gguf"))
    if gguf_file:
        chosen = Path(gguf_file)
        if not chosen.is_absolute():
            chosen = directory / gguf_file
        if not chosen.is_file():
            names = ", ".join(f.name for f in files) or "none"
            raise ModelLoadError(
                f"--gguf-file {gguf_file}: no such file in {directory} (GGUF files there: {names})"
            )
        return chosen
    if (directory / "config.json").exists() or not files:
        return None
    if len(files) > 1:
        raise ModelLoadError(
            f"{directory} holds {len(files)} GGUF files ("
            f"{', '.join(f.name for f in files)}); choose one with "
            "--gguf-file NAME (gguf_file=... in LLM)"
        )
    return files[0]


def _gguf_source(spec: str, file: Path, origin: str) -> ModelSource:
    from glowlm.model_loader.gguf_metadata import metadata_dir

    # A cache snapshot's file is a link to a blob named by its hash: keep the link's name,
    # the one the log lines show.
    where = Path(os.path.abspath(file)) if origin == "hf-cache" else file.resolve()
    return ModelSource(spec, metadata_dir(where), where, origin)


def resolve_model(
    spec: str | os.PathLike[str] | None, revision: str | None = None, gguf_file: str | None = None
) -> ModelSource:
    """Find the model ``spec`` names (see the module docstring for the order)."""
    if spec is None or str(spec) == "":
        from glowlm.default_model import default_model_file

        return _gguf_source("default", Path(default_model_file()), "default")
    text = str(spec)
    path = Path(text).expanduser()
    if path.is_file():
        from glowlm.model_loader import gguf

        if not gguf.is_gguf(path):
            raise ModelLoadError(
                f"{path} is a file but not a GGUF file; pass a .gguf file "
                "or a Hugging Face model directory"
            )
        return _gguf_source(text, path, "gguf")
    if path.is_dir():
        chosen = _pick_gguf(path, gguf_file)
        if chosen is not None:
            return _gguf_source(text, chosen, "gguf")
        return ModelSource(text, path, None, "directory")
    hub_id = split_spec(text)
    if hub_id is not None:
        return _from_hf_cache(text, hub_id[0], hub_id[1], revision, gguf_file)
    raise ModelLoadError(
        f"model {text} does not exist (glowlm reads a local Hugging Face "
        "directory, a .gguf file, or a Hugging Face ORG/NAME id, "
        "ORG/NAME:QUANT for one GGUF file of the repo)"
    )
