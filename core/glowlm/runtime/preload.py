"""Allocator and OpenMP runtime: detect them, and re-exec once with LD_PRELOAD.

Why re-exec: the dynamic loader reads LD_PRELOAD only when a program starts, and
malloc must be replaced before the first allocation, so the only way to apply
tcmalloc ourselves is to exec the same command again with it set. The reference
system asks users to find the libraries by hand; we find them and either re-exec
(CLI ``serve``/``generate``/``bench``) or print the exact line (Python API, or
``GLOWLM_NO_PRELOAD=1``).

Loop guard: the child gets ``GLOWLM_PRELOAD_APPLIED`` equal to the LD_PRELOAD we
set; while they match we never exec again, even if the loader ignored the
preload (secure-execution mode).

Intel OpenMP (libiomp5) is detected but never preloaded when torch uses libgomp:
preloading it interposes every ``GOMP_*``/``omp_*`` call torch and MKL make, with
libgomp still loaded beside it, so two runtimes with separate thread pools and
settings live in one process. The combination is common but unverified by us on
every torch build; we print the line for users who want to measure it.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from glowlm import envs

#: Verbs worth a re-exec: they run a model for long enough to gain from it.
REEXEC_VERBS = frozenset({"serve", "generate", "bench"})
ALLOCATORS = (("tcmalloc", ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")),
              ("jemalloc", ("libjemalloc.so.2",)))
IOMP = "libiomp5.so"
#: jemalloc's defaults hand big blocks back to the OS, which loses its whole gain on
#: prefill-sized tensors (docs/runtime.md); this is the setting PyTorch's CPU tuning
#: guide recommends, with "never purge" (-1) decay: jemalloc 5.3 ignores its huge
#: decay values. Applied only if the user set no MALLOC_CONF.
JEMALLOC_CONF = ("oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                 "dirty_decay_ms:-1,muzzy_decay_ms:-1")
_MAPPED = {"tcmalloc": r"libtcmalloc", "jemalloc": r"libjemalloc", "libiomp5": r"libiomp5",
           "libgomp": r"libgomp", "libomp": r"/libomp[.-]"}


def _search_dirs() -> list[Path]:
    machine = platform.machine()
    return [Path(sys.prefix) / "lib", Path(f"/usr/lib/{machine}-linux-gnu"),
            Path(f"/lib/{machine}-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib"),
            Path("/usr/local/lib")]


def _ldconfig() -> dict[str, str]:
    """soname -> path from the loader cache (``ldconfig -p``); empty if unavailable."""
    for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        found: dict[str, str] = {}
        for m in re.finditer(r"^\s*(\S+) \(([^)]*)\) => (\S+)$", out, re.MULTILINE):
            if "x86-64" in m.group(2) or platform.machine() != "x86_64":
                found.setdefault(m.group(1), m.group(3))
        return found
    return {}


def find_library(sonames: Sequence[str], dirs: Sequence[Path] | None = None,
                 cache: Mapping[str, str] | None = None) -> str | None:
    """The first of ``sonames`` in the venv's lib/, the usual dirs, or the loader cache."""
    for d in dirs if dirs is not None else _search_dirs():
        for name in sonames:
            if (d / name).is_file():
                return str(d / name)
    cache = _ldconfig() if cache is None else cache
    return next((cache[n] for n in sonames if n in cache), None)


def torch_openmp() -> tuple[str, str]:
    """(runtime name, path) of the OpenMP library torch ships, found without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "none", "torch is not installed"
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib"
    for name, pattern in (("libiomp5", "libiomp5*.so*"), ("libgomp", "libgomp*.so*"),
                          ("libomp", "libomp*.so*")):
        hits = sorted(lib.glob(pattern))
        if hits:
            return name, str(hits[0])
    return "libgomp", "linked from the system (torch ships no OpenMP library)"


def mapped(maps: str | None = None) -> dict[str, str]:
    """Allocator and OpenMP libraries mapped into this process (name -> path)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return {}
    out: dict[str, str] = {}
    for line in maps.splitlines():
        path = line.split()[-1] if "/" in line else ""
        for name, pattern in _MAPPED.items():
            if path and re.search(pattern, Path(path).name if name != "libomp" else path):
                out.setdefault(name, path)
    return out


@dataclass(frozen=True)
class PreloadDecision:
    """What to add to LD_PRELOAD, and why (every library found or skipped has a reason)."""

    add: tuple[str, ...]
    reasons: tuple[str, ...]
    ld_preload: str = ""  # the current LD_PRELOAD
    skipped_iomp: str | None = field(default=None)

    @property
    def new_ld_preload(self) -> str:
        return ":".join([*self.add, *filter(None, self.ld_preload.split(":"))])

    def advice(self, command: str = "glowlm serve MODEL") -> str:
        """The exact line to run to get the preload without glowlm's re-exec."""
        if not self.add:
            return ""
        conf = (f"MALLOC_CONF={JEMALLOC_CONF} " if any("jemalloc" in lib for lib in self.add)
                else "")
        return f"{conf}LD_PRELOAD={self.new_ld_preload} {command}"


def decide(ld_preload: str = "", loaded: Mapping[str, str] | None = None,
           allocator: tuple[str, str] | None = None, iomp: str | None = None,
           torch_runtime: str = "libgomp") -> PreloadDecision:
    """Pure choice from what was found: preload the allocator unless already there."""
    loaded = loaded or {}
    add: list[str] = []
    reasons: list[str] = []
    in_preload = {name for name, pattern in _MAPPED.items() if re.search(pattern, ld_preload)}
    present = next((n for n, _ in ALLOCATORS if n in loaded or n in in_preload), None)
    if present:
        reasons.append(f"{present} already in use")
    elif allocator is None:
        reasons.append("no tcmalloc or jemalloc found: glibc malloc stays (install "
                       "libtcmalloc-minimal4 on Debian/Ubuntu, gperftools-libs on Fedora/RHEL)")
    else:
        add.append(allocator[1])
        reasons.append(f"{allocator[0]} found: {allocator[1]}")
    skipped = None
    if iomp and torch_runtime == "libgomp" and "libiomp5" not in in_preload:
        skipped = iomp
        line = ":".join([*add, *filter(None, ld_preload.split(":")), iomp])
        reasons.append(f"Intel OpenMP found ({iomp}) but torch uses libgomp: not preloaded, "
                       "to keep one OpenMP runtime per process (docs/runtime.md); to try "
                       f"it yourself: LD_PRELOAD={line}")
    elif torch_runtime == "libiomp5":
        reasons.append("torch ships Intel OpenMP itself: nothing to preload for OpenMP")
    return PreloadDecision(tuple(add), tuple(reasons), ld_preload, skipped)


def decide_live(environ: Mapping[str, str] | None = None) -> PreloadDecision:
    """:func:`decide` for this process and machine."""
    environ = os.environ if environ is None else environ
    allocator = None
    for name, sonames in ALLOCATORS:
        path = find_library(sonames)
        if path:
            allocator = (name, path)
            break
    iomp = find_library([IOMP], [Path(sys.prefix) / "lib"], cache={})
    return decide(environ.get("LD_PRELOAD", ""), mapped(), allocator, iomp, torch_openmp()[0])


#: mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -2, -4, -8
#: Whether :func:`tune_glibc_malloc` changed this process's malloc (for :func:`describe`).
_TUNED: list[bool] = [False]


def tune_glibc_malloc(environ: Mapping[str, str] | None = None) -> bool:
    """Make glibc malloc keep freed memory for reuse, where no tcmalloc/jemalloc runs.

    Why: glibc serves every block above its mmap threshold (128 KiB, adapting up to
    32 MiB) with a fresh ``mmap`` and unmaps it on free, so each prefill step's
    activations (a 1,024-token chunk of a 1 B model has 32 MiB gate/up outputs) are
    page-faulted in again, zero-filled by the kernel: on a 2-vCPU Zen 4 guest a
    1,024-token prefill took 7.6 s with the defaults and 4.7 s tuned (sys time was
    most of the difference; docs/runtime.md). Tuned: no mmap for blocks
    (``M_MMAP_MAX=0``), one arena (``M_ARENA_MAX=1``: a thread's own arena is an
    mmap'd 64 MiB heap, too small for such blocks, so it would fall back to mmap),
    freed memory never trimmed (``M_TRIM_THRESHOLD``), and the heap grown 64 MiB at
    a time. The cost is tcmalloc's: memory freed stays with the process, so its
    resident size stays at its peak — a little above it, as torch's 64-byte aligned
    requests do not always fit the block freed last until free blocks coalesce (a
    loop of 64 MiB blocks settles after ~5). The KV cache is not malloc'd
    (hugepages.mapped_zeros), so none of this holds a cache after its engine is gone.
    Call it as early as possible — before threads start, as the CLI does — since
    threads that already own an arena keep it.
    ``GLOWLM_NO_MALLOC_TUNING=1`` opts out; Linux with glibc only.
    """
    environ = os.environ if environ is None else environ
    if _TUNED[0]:
        return True
    if (envs.parse(environ).no_malloc_tuning or not sys.platform.startswith("linux")
            or platform.libc_ver()[0] != "glibc"):
        return False
    loaded = mapped()
    if any(n in loaded for n, _ in ALLOCATORS):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        ok = all(libc.mallopt(param, value) == 1 for param, value in (
            (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1),
            (_M_TOP_PAD, 64 << 20)))
    except (OSError, AttributeError):
        return False
    _TUNED[0] = ok
    return ok


def _verb(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def maybe_reexec(argv: Sequence[str] | None = None,
                 environ: Mapping[str, str] | None = None) -> PreloadDecision | None:
    """Re-exec this command once with LD_PRELOAD set; return the decision if we did not.

    Call first thing in the CLI's ``main`` (before torch is imported, so the first
    run costs little). Execs only for ``serve``/``generate``/``bench`` run from the
    real command line (``argv is None``; an explicit ``argv`` means a programmatic
    call, whose process is not ours to replace), on Linux, unless
    ``GLOWLM_NO_PRELOAD=1`` or this process is already the re-exec'd one.
    """
    environ = os.environ if environ is None else environ
    programmatic = argv is not None
    args = list(sys.argv[1:] if argv is None else argv)
    if _verb(args) not in REEXEC_VERBS or not sys.platform.startswith("linux"):
        return None
    env = envs.parse(environ)
    current = environ.get("LD_PRELOAD", "")
    if env.no_preload or (env.preload_applied and env.preload_applied == current):
        return None
    decision = decide_live(environ)
    if not decision.add or programmatic:
        return decision
    child = dict(environ)
    child["LD_PRELOAD"] = decision.new_ld_preload
    child["GLOWLM_PRELOAD_APPLIED"] = decision.new_ld_preload
    # gperftools can report allocations above 1 GiB on stderr; a KV cache is one.
    child.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(1 << 40))
    if any("jemalloc" in lib for lib in decision.add):
        child.setdefault("MALLOC_CONF", JEMALLOC_CONF)
    sys.stdout.flush()
    sys.stderr.flush()
    command = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    os.execve(sys.executable, [sys.executable, *command[1:]], child)
    return decision  # unreachable: execve replaces the process or raises


def describe(environ: Mapping[str, str] | None = None) -> str:
    """One start-up log line: the allocator and OpenMP runtime in use, and why."""
    environ = os.environ if environ is None else environ
    env = envs.parse(environ)
    loaded = mapped()
    allocator = next((n for n, _ in ALLOCATORS if n in loaded), "glibc malloc")
    omp = ", ".join(n for n in ("libgomp", "libiomp5", "libomp") if n in loaded) or "none yet"
    how = ""
    if env.preload_applied and env.preload_applied == environ.get("LD_PRELOAD"):
        how = " (LD_PRELOAD set by glowlm's re-exec; GLOWLM_NO_PRELOAD=1 to opt out)"
    elif allocator == "glibc malloc":
        line = decide_live(environ).advice("<your command>")
        how = f" (faster: {line})" if line else ""
        if _TUNED[0]:
            allocator += (" (tuned to keep freed blocks for reuse; GLOWLM_NO_MALLOC_TUNING=1 "
                          "to opt out)")
    return f"allocator {allocator}, OpenMP {omp}{how}"
