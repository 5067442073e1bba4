"""Which files of a Hugging Face repo glowlm reads, and which GGUF file a tag names.

One planner serves both sides of a Hub model: before a download it turns the repo's
file list (the Hub's ``siblings``) into the ``allow_patterns`` to fetch, so a repo
holding PyTorch, ONNX, Flax and a dozen GGUF quantizations costs the bytes of one
checkpoint; offline it turns the cached tree listing into the files a complete
snapshot must hold, so an interrupted download is never taken for a model.

GGUF repos are addressed as llama-server does (``ORG/NAME:Q4_K_M``): the tag picks
the one ``.gguf`` file whose name holds that quantization type, case-insensitive and
as a whole word (``Q4_K`` does not pick ``Q4_K_M``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from glowlm.errors import ModelLoadError

#: Metadata files glowlm (and transformers' config and tokenizer loading) read.
METADATA_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "quantize_config.json",
    "quant_config.json",
)
INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
#: What llama-server picks when the tag is omitted and a repo holds several files.
DEFAULT_TAG = "Q4_K_M"

_SPEC = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<tag>[\w.-]+))?$")
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class FilePlan:
    """The files to fetch (or find) for one model of a repo."""

    files: tuple[str, ...]  # metadata and weights; for sharded weights, the index
    gguf_file: str | None = None  # the GGUF file, when the weights are one
    index: str | None = None  # the safetensors index whose shards come next


def split_spec(text: str) -> tuple[str, str | None] | None:
    """``ORG/NAME`` or ``ORG/NAME:TAG`` -> (repo id, tag or None); None for anything else."""
    m = _SPEC.match(text)
    if not m or text.startswith(("./", "../")):
        return None
    tag = m.group("tag")
    return m.group("repo"), (None if tag is None or tag.lower() == "latest" else tag)


def _listing(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "") or "none"


def _matches(name: str, tag: str) -> bool:
    pattern = rf"(?<![A-Za-z0-9]){re.escape(tag)}(?![A-Za-z0-9_])"
    return re.search(pattern, PurePosixPath(name).name, re.IGNORECASE) is not None


def pick_gguf(names: list[str], tag: str | None, explicit: str | None, where: str) -> str:
    """The one GGUF file of ``names`` that ``explicit`` (``--gguf-file``) or ``tag``
    (``:Q4_0``) names, else the only one, else llama-server's default (Q4_K_M) when
    exactly one file has it. Anything else is one line listing the files."""
    ggufs = sorted(n for n in names if n.lower().endswith(".gguf"))
    models = [n for n in ggufs if not PurePosixPath(n).name.lower().startswith("mmproj")]
    if explicit:
        by_name = [n for n in ggufs if n == explicit or PurePosixPath(n).name == explicit]
        if len(by_name) == 1:
            return by_name[0]
        raise ModelLoadError(
            f"--gguf-file {explicit}: {where} has no such file (GGUF files "
            f"there: {_listing(ggufs)})"
        )
    if not models:
        raise ModelLoadError(
            f"{where} holds no GGUF file" + (f" for the tag :{tag}" if tag else "")
        )
    if tag is None and len(models) == 1:
        return models[0]
    chosen = [n for n in models if _matches(n, tag or DEFAULT_TAG)]
    if len(chosen) == 1:
        return chosen[0]
    if tag is None:
        raise ModelLoadError(
            f"{where} holds {len(models)} GGUF files ({_listing(models)}); choose one with "
            f"{where}:QUANT (e.g. :{DEFAULT_TAG}) or --gguf-file NAME (gguf_file=... in LLM)"
        )
    if not chosen:
        raise ModelLoadError(
            f"no GGUF file of {where} matches :{tag} (GGUF files there: "
            f"{_listing(models)}); name one with --gguf-file NAME"
        )
    if all(_SPLIT.search(n) for n in chosen):
        raise ModelLoadError(
            f"{where}:{tag} is a GGUF file split in {len(chosen)} parts ({_listing(chosen)}); "
            "glowlm reads one file: merge them with `llama-gguf-split --merge`, or pick "
            "another quantization"
        )
    raise ModelLoadError(
        f"{where}:{tag} matches {len(chosen)} GGUF files ({_listing(chosen)});"
        " choose one with --gguf-file NAME"
    )


def plan_files(
    names: list[str],
    *,
    tag: str | None = None,
    gguf_file: str | None = None,
    allow_pickle: bool = False,
    where: str = "the repo",
) -> FilePlan:
    """The files of a repo (paths as the Hub lists them) that make the model glowlm loads:
    a GGUF file when one is asked for or the repo has no ``config.json``; otherwise the
    metadata files and the safetensors weights (the index first, when sharded), or with
    ``allow_pickle`` the ``*.bin`` weights of a repo that has no safetensors."""
    top = [n for n in names if "/" not in n]
    has_config = "config.json" in top
    weights = sorted(n for n in top if n.endswith(".safetensors"))
    checkpoint = has_config and (INDEX in top or bool(weights))
    if tag or gguf_file or (not checkpoint and any(n.lower().endswith(".gguf") for n in names)):
        chosen = pick_gguf(names, tag, gguf_file, where)
        return FilePlan((chosen,), gguf_file=chosen)
    if not has_config:
        raise ModelLoadError(
            f"{where} has neither a config.json nor a GGUF file (files there: "
            f"{_listing(sorted(names))}); glowlm cannot load it"
        )
    meta = tuple(n for n in METADATA_FILES if n in top)
    if INDEX in top:
        return FilePlan((*meta, INDEX), index=INDEX)
    if weights:
        return FilePlan((*meta, *weights))
    pickles = sorted(n for n in top if n.endswith(".bin"))
    if pickles and allow_pickle:
        extra = (PICKLE_INDEX,) if PICKLE_INDEX in top else ()
        return FilePlan((*meta, *extra, *pickles))
    if pickles:
        raise ModelLoadError(
            f"{where} has only pickle weights ({pickles[0]}); loading them runs arbitrary "
            "code. Pass --allow-pickle (allow_pickle=True) if you trust the source"
        )
    raise ModelLoadError(f"{where} has no weights (*.safetensors, or a GGUF file)")


def index_shards(index_file: Path) -> list[str]:
    """The shard files a ``model.safetensors.index.json`` names."""
    try:
        weight_map = json.loads(index_file.read_text())["weight_map"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{index_file}: not a valid safetensors index ({exc})") from None
    return sorted(set(weight_map.values()))


def missing_files(snapshot: Path, plan: FilePlan) -> list[str]:
    """The plan's files (and its index's shards) that ``snapshot`` lacks: a snapshot
    only ever holds whole files, so a missing one is a download that did not finish."""
    missing = [f for f in plan.files if not (snapshot / f).is_file()]
    if plan.index and (snapshot / plan.index).is_file():
        missing += [f for f in index_shards(snapshot / plan.index) if not (snapshot / f).is_file()]
    return missing
