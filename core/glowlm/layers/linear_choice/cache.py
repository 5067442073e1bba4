"""The on-disk cache of the linear choice: one JSON file per host key.

The key is the CPU model, a hash of every CPU flag, the thread count, glowlm's and
Python's versions, and each candidate's name and version, so a different host,
thread count or kernel build measures again and the same one starts for free.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform as _platform
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glowlm.logger import init_logger
from glowlm.ops.linear import LinearCandidate

if TYPE_CHECKING:
    from glowlm.platforms.host import HostInfo

logger = init_logger("glowlm.layers.linear_choice")

#: The file format of the cache; bump when the meaning of an entry changes.
SCHEMA = 4  # 2: the "small" token class; 3: timed at 8 rows; 4: FUSED_MARGIN


def host_key(host: HostInfo, threads: int) -> dict[str, object]:
    from glowlm.version import __version__

    flags = hashlib.sha256(" ".join(sorted(host.flags)).encode()).hexdigest()[:16]
    return {"schema": SCHEMA, "cpu": host.model_name or "unknown", "flags": flags,
            "threads": threads, "glowlm": __version__, "python": _platform.python_version()}


def cache_file(cache_dir: str | Path, key: dict[str, object],
               candidates: Iterable[LinearCandidate]) -> Path:
    versions = {c.name: c.version for c in candidates}
    blob = json.dumps({"host": key, "candidates": versions}, sort_keys=True)
    return Path(cache_dir) / f"{hashlib.sha256(blob.encode()).hexdigest()[:24]}.json"


def read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else {}


def write_cache(path: Path, data: dict[str, Any]) -> None:
    """Atomically (a temporary file renamed), so two engines starting at once never
    read half a file; failures only cost the next start a measurement."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as exc:
        logger.warning("could not write the linear choice cache %s: %s", path, exc)


def cached_choices(cache_dir: str | Path, host: HostInfo) -> list[dict[str, Any]]:
    """Every cache file of this CPU (any thread count or kernel build): collect-env."""
    mine = host_key(host, 0)
    out = []
    for path in sorted(Path(cache_dir).glob("*.json")):
        data = read_cache(path)
        key = data.get("host", {})
        if key.get("cpu") == mine["cpu"] and key.get("flags") == mine["flags"]:
            out.append({"file": str(path), **data})
    return out
