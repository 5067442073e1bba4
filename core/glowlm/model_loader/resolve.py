"""What the user typed as MODEL -> the files glowlm reads.

One function, :func:`resolve_model`, answers for every entry point (``LLM(...)``,
``glowlm generate``, ``serve``, ``bench``), in this order:

1. nothing: the default model (:mod:`glowlm.default_model`);
2. a ``.gguf`` file: that file;
3. a directory: a Hugging Face directory (``config.json`` + weights), or the one GGUF
   file it holds, or the one ``gguf_file`` names when it holds several;
4. ``ORG/NAME`` that is not a local path: the Hugging Face cache (``HF_HUB_CACHE``,
   ``HF_HOME``), offline, at ``revision``; never the network.

Every miss is one :class:`~glowlm.errors.ModelLoadError` line that says where glowlm
looked and what to do.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from glowlm.errors import ModelLoadError

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class ModelSource:
    """Where a model's metadata and weights are."""

    spec: str                  # what the user gave
    path: Path                 # a directory with config.json and the tokenizer
    gguf_file: Path | None     # the weights, when they are a GGUF file
    origin: str                # "directory", "gguf", "hf-cache" or "default"

    def describe(self) -> str:
        where = self.gguf_file or self.path
        return f"{self.spec} ({where})" if str(where) != self.spec else str(where)


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment at call time."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def _from_hf_cache(repo_id: str, revision: str | None) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - a dependency of transformers
        raise ModelLoadError(f"{repo_id!r} is not a local path, and resolving Hugging Face "
                             "ids needs huggingface_hub") from None
    cache = hf_cache_dir()
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=str(cache),
                                 local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - LocalEntryNotFoundError and friends
        at = f" at revision {revision}" if revision else ""
        raise ModelLoadError(
            f"model {repo_id}{at} is neither a local path nor in the Hugging Face cache "
            f"({cache}; set HF_HUB_CACHE or HF_HOME to look elsewhere): on a connected "
            f"machine run `hf download {repo_id}` and copy that cache here, or pass a "
            f"local directory or .gguf file ({type(exc).__name__})") from None
    return Path(path)


def _pick_gguf(directory: Path, gguf_file: str | None) -> Path | None:
    files = sorted(directory.glob("*.gguf"))
    if gguf_file:
        chosen = Path(gguf_file)
        if not chosen.is_absolute():
            chosen = directory / gguf_file
        if not chosen.is_file():
            names = ", ".join(f.name for f in files) or "none"
            raise ModelLoadError(f"--gguf-file {gguf_file}: no such file in {directory} "
                                 f"(GGUF files there: {names})")
        return chosen
    if (directory / "config.json").exists() or not files:
        return None
    if len(files) > 1:
        raise ModelLoadError(f"{directory} holds {len(files)} GGUF files ("
                             f"{', '.join(f.name for f in files)}); choose one with "
                             "--gguf-file NAME (gguf_file=... in LLM)")
    return files[0]


def _gguf_source(spec: str, file: Path, origin: str) -> ModelSource:
    from glowlm.model_loader.gguf_metadata import metadata_dir

    return ModelSource(spec, metadata_dir(file), file.resolve(), origin)


def resolve_model(spec: str | os.PathLike[str] | None, revision: str | None = None,
                  gguf_file: str | None = None) -> ModelSource:
    """Find the model ``spec`` names (see the module docstring for the order)."""
    if spec is None or str(spec) == "":
        from glowlm.default_model import default_model_file

        return _gguf_source("default", Path(default_model_file()), "default")
    text = str(spec)
    path = Path(text).expanduser()
    if path.is_file():
        from glowlm.model_loader import gguf

        if not gguf.is_gguf(path):
            raise ModelLoadError(f"{path} is a file but not a GGUF file; pass a .gguf file "
                                 "or a Hugging Face model directory")
        return _gguf_source(text, path, "gguf")
    if path.is_dir():
        chosen = _pick_gguf(path, gguf_file)
        if chosen is not None:
            return _gguf_source(text, chosen, "gguf")
        return ModelSource(text, path, None, "directory")
    if _HF_ID.match(text) and not text.startswith(("./", "../")):
        snapshot = _from_hf_cache(text, revision)
        chosen = _pick_gguf(snapshot, gguf_file)
        if chosen is not None:
            return _gguf_source(text, chosen, "hf-cache")
        return ModelSource(text, snapshot, None, "hf-cache")
    raise ModelLoadError(f"model {text} does not exist (glowlm reads a local Hugging Face "
                         "directory, a .gguf file, or an ORG/NAME id from the Hugging Face "
                         "cache)")
