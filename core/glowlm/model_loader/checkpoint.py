"""Find and iterate a directory's weight files without loading them all at once."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from glowlm.errors import ModelLoadError


def weight_files(model_dir: Path, allow_pickle: bool) -> list[Path]:
    """The checkpoint shards: an index's files, or every ``*.safetensors``.

    Pickle files (``*.bin``, ``*.pt``) run code when loaded, so they are used
    only when the user passed ``allow_pickle`` (``--allow-pickle``).
    """
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise ModelLoadError(f"{index}: not a valid safetensors index ({exc})") from None
        files = [model_dir / f for f in sorted(set(weight_map.values()))]
        for f in files:
            if not f.exists():
                raise ModelLoadError(f"{index} names {f.name}, which is missing")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(model_dir.glob("*.bin")) + sorted(model_dir.glob("*.pt"))
    if pickles:
        if not allow_pickle:
            raise ModelLoadError(
                f"{model_dir} has only pickle weights ({pickles[0].name}); loading them runs "
                "arbitrary code. Convert them to safetensors, or pass --allow-pickle if you "
                "trust the source")
        return pickles
    raise ModelLoadError(f"{model_dir} has no weights (*.safetensors)")


def iterate_tensors(files: list[Path], dtype: torch.dtype
                    ) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """Yield ``(name, load)``; ``load()`` reads one tensor and casts floats to ``dtype``."""

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if t.is_floating_point() else t

    for path in files:
        if path.suffix == ".safetensors":
            try:
                handle = safe_open(str(path), framework="pt")
            except Exception as exc:  # noqa: BLE001 - safetensors raises several types
                raise ModelLoadError(f"{path}: cannot read safetensors file ({exc})") from None
            with handle as f:
                for name in f.keys():
                    yield name, (lambda f=f, name=name: cast(f.get_tensor(name)))
        else:
            state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
            for name, tensor in state.items():
                yield name, (lambda t=tensor: cast(t))


def count_tensors(files: list[Path]) -> int:
    total = 0
    for path in files:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                total += len(list(f.keys()))
    return total
