"""glowlm-x86's compiled kernels.

- ``csrc/``: the C++ ops (``vec.h`` abstracts the SIMD ISA), declared once in
  ``TORCH_LIBRARY(glowlm_x86, m)``.
- :mod:`.build`: compile-once-and-cache, and loading the module for this CPU's ISA.
- :mod:`.ops`: typed wrappers and the fake (meta) implementations.
- :mod:`.attention`: the x86 :class:`~glowlm.attention.backend.AttentionBackend`.
- :mod:`.linear`: the x86 unquantized :class:`~glowlm.layers.linear.LinearMethod`.
"""

from __future__ import annotations

from glowlm.platforms.host import HostInfo

from glowlm_x86.kernels.build import ISA_FLAGS, KernelLibrary, load_kernels

#: fp32 lanes per SIMD register for each kernel ISA (head and block sizes must be multiples).
VECTOR_WIDTH = {"avx2": 8, "avx512": 16}


def cpu_isa(cpu: HostInfo, allow_avx512: bool = True) -> str | None:
    """The best kernel ISA ``cpu`` can execute (AVX-512 needs F, BW and VL), or ``None``."""
    if allow_avx512 and all(cpu.has_flag(f) for f in ("avx512f", "avx512bw", "avx512vl")):
        return "avx512"
    if all(cpu.has_flag(f) for f in ("avx2", "fma", "f16c")):
        return "avx2"
    return None


def load(isa: str, cache_dir: str) -> KernelLibrary | None:
    """Load the kernels for ``isa`` (building once if needed) and register their fakes."""
    library = load_kernels(isa, cache_dir)
    if library is not None:
        from glowlm_x86.kernels import ops

        ops.register_fakes()
    return library


__all__ = ["ISA_FLAGS", "VECTOR_WIDTH", "KernelLibrary", "cpu_isa", "load"]
