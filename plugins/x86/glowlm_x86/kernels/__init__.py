"""glowlm-x86's compiled kernels.

- ``csrc/``: the C++ ops (``vec.h`` abstracts the SIMD ISA), declared once in
  ``TORCH_LIBRARY(glowlm_x86, m)``.
- :mod:`.build`: compile-once-and-cache, and loading the module for this CPU's ISA.
- :mod:`.ops`: typed wrappers and the fake (meta) implementations.
- :mod:`.attention`: the x86 :class:`~glowlm.attention.backend.AttentionBackend`.
- :mod:`.linear`: the x86 unquantized :class:`~glowlm.ops.linear.LinearMethod`.
"""

from __future__ import annotations

from glowlm.plugin_api import ConfigError, HostInfo

from glowlm_x86.kernels.build import ISA_FLAGS, KernelLibrary, load_kernels

#: fp32 lanes per SIMD register for each kernel ISA (head and block sizes must be multiples).
VECTOR_WIDTH = {"avx2": 8, "avx512": 16, "avx512-bf16": 16, "portable": 8}
_AVX512 = ("avx512f", "avx512bw", "avx512vl")
#: The CPU flags each module needs (/proc/cpuinfo names), best first.
_FLAGS = {"avx512-bf16": (*_AVX512, "avx512_bf16"), "avx512": _AVX512,
          "avx2": ("avx2", "fma", "f16c")}


def cpu_isa(cpu: HostInfo, allow_avx512: bool = True, requested: str | None = None) -> str | None:
    """The kernel ISA to load on ``cpu``: ``requested`` (``GLOWLM_KERNEL_ISA``) if given,
    else the best it executes (AVX-512 needs F, BW and VL; ``avx512-bf16`` also
    AVX512_BF16); ``None`` if it runs neither. A lower module may be requested on a
    higher CPU (``GLOWLM_KERNEL_ISA=avx512`` on a Zen 5): that is how its tests run.

    A request the CPU cannot execute is a :class:`ConfigError`, never a crash on an
    illegal instruction; ``portable`` runs on any CPU.
    """
    if requested is not None:
        if requested not in ISA_FLAGS:
            raise ConfigError(f"GLOWLM_KERNEL_ISA={requested!r}: the x86 kernels are built "
                              f"for {', '.join(ISA_FLAGS)}")
        missing = [f for f in _FLAGS.get(requested, ()) if not cpu.has_flag(f)]
        if missing or (requested.startswith("avx512") and not allow_avx512):
            why = f"lacks {', '.join(missing)}" if missing else "runs the AVX2 platform"
            raise ConfigError(f"GLOWLM_KERNEL_ISA={requested}: this CPU {why}")
        return requested
    for isa, flags in _FLAGS.items():
        if (allow_avx512 or not isa.startswith("avx512")) and all(cpu.has_flag(f)
                                                                   for f in flags):
            return isa
    return None


def load(isa: str, cache_dir: str) -> KernelLibrary | None:
    """Load the kernels for ``isa`` (building once if needed) and register their fakes."""
    library = load_kernels(isa, cache_dir)
    if library is not None:
        from glowlm_x86.kernels import ops

        ops.register_fakes()
    return library


__all__ = ["ISA_FLAGS", "VECTOR_WIDTH", "KernelLibrary", "cpu_isa", "load"]
