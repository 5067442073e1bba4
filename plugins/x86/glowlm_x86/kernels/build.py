"""Compile the x86 kernels once per (source hash, ISA, torch and Python version); load them.

The compiled module is a plain shared library whose ``TORCH_LIBRARY`` block
registers the ``torch.ops.glowlm_x86`` operators when it is loaded. There is one
module per ISA, built with that ISA's ``-m`` flags, and a process loads only the
one its CPU supports, so an AVX2-only CPU never executes AVX-512 code.

Nothing here touches the network. The first use compiles with
``torch.utils.cpp_extension.load`` into ``<GLOWLM_KERNEL_CACHE>/<name>/`` (one log
line says so); later processes load the cached ``.so`` directly, without a
compiler. Any failure is reported as one warning line and :func:`load_kernels`
returns ``None``, so the platform falls back to core's reference kernels.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from glowlm.logger import init_logger

# Under the "glowlm" hierarchy so the message reaches glowlm's stderr handler.
logger = init_logger("glowlm.x86.kernels")

CSRC = Path(__file__).parent / "csrc"
SOURCES = (
    "registration.cpp", "norm_act.cpp", "rotary.cpp", "linear.cpp", "gemm.cpp", "attention.cpp",
    "fused_layer.cpp",
)
COMMON_FLAGS = ("-O3", "-fopenmp", "-DNDEBUG")
ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
    "avx512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"),
    # vec_portable.h: GCC vector extensions for the compiler's baseline target. Proves
    # the kernels need only vec.h's names; a port to another ISA starts from it.
    "portable": ("-DGLOWLM_VEC_PORTABLE",),
}
#: Rough first-build time on a busy 2-vCPU machine with MAX_JOBS=1 (shown to the user).
EXPECTED_BUILD_SECONDS = 240


@dataclass(frozen=True)
class KernelLibrary:
    """A loaded kernel module: which ISA, and where its shared library lives."""

    isa: str
    name: str
    path: Path


_lock = threading.Lock()
_loaded: dict[str, KernelLibrary | None] = {}


def source_hash(isa: str) -> str:
    """Hash of every C++ source and header, the flags, and the torch and Python versions."""
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".cpp", ".h"):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    h.update(" ".join(COMMON_FLAGS + ISA_FLAGS[isa]).encode())
    h.update(torch.__version__.encode())
    h.update(f"py{sys.version_info.major}{sys.version_info.minor}".encode())
    return h.hexdigest()[:16]


def module_name(isa: str) -> str:
    return f"glowlm_x86_{isa}_{source_hash(isa)}"


def _compiler() -> str | None:
    return next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


def _build(isa: str, name: str, build_dir: Path) -> Path:
    from torch.utils import cpp_extension

    if _compiler() is None:
        raise RuntimeError("no C++ compiler (c++, g++ or clang++) on PATH")
    if not cpp_extension.is_ninja_available():
        raise RuntimeError("ninja is not installed (pip install ninja)")
    build_dir.mkdir(parents=True, exist_ok=True)
    logger.info("compiling glowlm-x86 kernels (%s), once, ~%d s...", isa,
                EXPECTED_BUILD_SECONDS)
    start = time.perf_counter()
    cpp_extension.load(
        name=name,
        sources=[str(CSRC / s) for s in SOURCES],
        extra_cflags=list(COMMON_FLAGS + ISA_FLAGS[isa]),
        extra_ldflags=["-fopenmp"],
        extra_include_paths=[str(CSRC)],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=False,
    )
    logger.info("compiled glowlm-x86 kernels (%s) in %.0f s into %s", isa,
                time.perf_counter() - start, build_dir)
    return build_dir / f"{name}.so"


def load_kernels(isa: str, cache_dir: str) -> KernelLibrary | None:
    """Load (building first if needed) the kernel module for ``isa``; ``None`` on failure.

    Idempotent and thread-safe within a process: the operators can be registered
    only once, so the first result is remembered. Runs in every process that
    builds an x86 engine.
    """
    if isa not in ISA_FLAGS:
        logger.warning("glowlm-x86 kernels: unknown ISA %r (known: %s); using reference "
                       "kernels", isa, ", ".join(ISA_FLAGS))
        return None
    with _lock:
        if isa in _loaded:
            return _loaded[isa]
        library: KernelLibrary | None = None
        try:
            name = module_name(isa)
            build_dir = Path(cache_dir) / name
            so_path = build_dir / f"{name}.so"
            if not so_path.exists():
                so_path = _build(isa, name, build_dir)
            if not _ops_registered():
                torch.ops.load_library(str(so_path))
            library = KernelLibrary(isa, name, so_path)
        except Exception as exc:  # a broken toolchain must not stop the engine
            reason = _one_line(str(exc)) or type(exc).__name__
            logger.warning("glowlm-x86 kernels unavailable (%s: %s); using core's reference "
                           "kernels", type(exc).__name__, reason)
        _loaded[isa] = library
        return library


def _one_line(text: str) -> str:
    """The first compiler ``error:`` line of a build log, else the message, shortened."""
    errors = [ln.strip() for ln in text.splitlines() if "error:" in ln]
    return " ".join((errors[0] if errors else text).split())[:300]


def _ops_registered() -> bool:
    try:
        torch.ops.glowlm_x86.rms_norm.default  # noqa: B018 - raises if not registered
    except (AttributeError, RuntimeError):
        return False
    return True
