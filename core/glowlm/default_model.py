"""The small model glowlm ships, so the first command works with no download."""

from __future__ import annotations

import json
from pathlib import Path

from glowlm.errors import ModelLoadError

PATH = Path(__file__).parent / "data" / "default_model"


def default_model_path() -> str:
    if not (PATH / "config.json").exists():
        raise ModelLoadError(f"the embedded default model is missing from {PATH}; pass a model "
                             "directory, or run tools/train_default_model.py")
    return str(PATH)


def describe() -> dict[str, object]:
    """Size and evaluation figures of the embedded model, for ``glowlm models``."""
    info: dict[str, object] = {"name": "glowlm-stdlib-coder", "path": str(PATH)}
    size = sum(f.stat().st_size for f in PATH.glob("*") if f.is_file()) if PATH.exists() else 0
    info["size_mb"] = round(size / 1e6, 1)
    for name in ("training_info.json", "eval.json"):
        f = PATH / name
        if f.exists():
            info[name.removesuffix(".json")] = json.loads(f.read_text())
    return info
