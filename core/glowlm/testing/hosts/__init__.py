"""Recorded hosts: real machines' ``/proc/cpuinfo`` and ``sysctl -a`` dumps, as package data.

Plugin authors test detection against them without the hardware (provenance in
this folder's README.md)::

    from glowlm.testing import hosts

    host = hosts.load("x86_64-zen4-epyc-9r14", modules={"zentorch"})
    assert MyPlatform.detect(host).matched

They ship inside the ``glowlm`` distribution, so a plugin in its own repository
uses them as they are installed; nothing reads core's source tree.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from glowlm.platforms.host import HostInfo, from_dump

#: The folder holding the dumps (``<uname -m>-<cpu>.cpuinfo`` / ``.sysctl``).
HOSTS_DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """Every recorded host, by file stem (``aarch64-graviton3-neoverse-v1``, ...)."""
    return sorted(p.stem for p in HOSTS_DIR.iterdir() if p.suffix in (".cpuinfo", ".sysctl"))


def path(name: str) -> Path:
    """The dump file of host ``name`` (a stem from :func:`names`, or a file name)."""
    for candidate in (HOSTS_DIR / name, HOSTS_DIR / f"{name}.cpuinfo",
                      HOSTS_DIR / f"{name}.sysctl"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no recorded host {name!r}; recorded: {', '.join(names())}")


def load(name: str, modules: Iterable[str] = ()) -> HostInfo:
    """Host ``name`` as detectors see it; ``modules`` are assumed importable there."""
    return from_dump(path(name), modules=frozenset(modules))


__all__ = ["HOSTS_DIR", "load", "names", "path"]
