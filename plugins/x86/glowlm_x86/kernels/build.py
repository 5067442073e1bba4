"""Load glowlm-x86's compiled kernels: one module per ISA, built from the shared tree.

The C++ lives once, in ``glowlm_kernels/csrc`` (the ``glowlm-kernels`` package, shared
with glowlm-arm and glowlm-s390x); this module names the x86 variants and loads the
one this CPU runs. Each module registers the ``torch.ops.glowlm_x86`` operators when
it is loaded, built with that ISA's ``-m`` flags, so an AVX2-only CPU never executes
AVX-512 code.

``pip install`` (and ``make install``) compiles the avx2 and avx512 modules ahead of
time into this package (``glowlm_x86/_kernels_<isa>.*.so``, see ``setup.py``), so a
process loads them without a compiler. The run-time compile into
``<GLOWLM_KERNEL_CACHE>/<name>/`` is the developer fallback (an editable checkout
whose sources changed since the install, or ``GLOWLM_KERNEL_ISA=portable``). Any
failure is one warning line and :func:`load_kernels` returns ``None``, so the platform
falls back to core's reference kernels.
"""

from __future__ import annotations

from pathlib import Path

from glowlm.plugin_api import init_logger
from glowlm_kernels import build as shared
from glowlm_kernels.build import KernelLibrary

# Under the "glowlm" hierarchy so the message reaches glowlm's stderr handler.
logger = init_logger("glowlm.x86.kernels")

CSRC = shared.CSRC
SOURCES = shared.TORCH_SOURCES
VARIANTS = shared.VARIANTS["x86"]
ISA_FLAGS: dict[str, tuple[str, ...]] = {isa: v.flags for isa, v in VARIANTS.items()}
COMMON_FLAGS = ("-O3", "-fopenmp", "-DNDEBUG")
EXPECTED_BUILD_SECONDS = shared.EXPECTED_BUILD_SECONDS
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def source_hash(isa: str) -> str:
    """Hash of every C++ source and header, the flags, and the torch and Python versions."""
    return shared.source_hash(VARIANTS[isa])


def module_name(isa: str) -> str:
    return shared.module_name(VARIANTS[isa])


def _compiler() -> str | None:
    return shared.compiler()


def load_kernels(isa: str, cache_dir: str) -> KernelLibrary | None:
    """Load the kernel module for ``isa`` (prebuilt, else built once); ``None`` on failure.

    Idempotent and thread-safe within a process: the operators can be registered
    only once, so the first result is remembered. Runs in every process that
    builds an x86 engine.
    """
    if isa not in VARIANTS:
        logger.warning("glowlm-x86 kernels: unknown ISA %r (known: %s); using reference "
                       "kernels", isa, ", ".join(VARIANTS))
        return None
    return shared.load(VARIANTS[isa], PACKAGE_DIR, cache_dir, logger)


def _one_line(text: str) -> str:
    return shared.one_line(text)


def _ops_registered() -> bool:
    return shared.ops_registered("glowlm_x86")


__all__ = ["CSRC", "ISA_FLAGS", "SOURCES", "KernelLibrary", "load_kernels", "module_name",
           "source_hash"]
