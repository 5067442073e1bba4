"""Test helpers: load the compiled kernels for this CPU, or skip the test saying why."""

from __future__ import annotations

import pytest
from glowlm.plugin_api import core_env
from glowlm.plugin_api import live_host as live

from glowlm_x86.kernels import VECTOR_WIDTH, KernelLibrary, cpu_isa, load
from glowlm_x86.settings import KERNEL_ISA


def require_kernels() -> KernelLibrary:
    """The loaded kernel module, or ``pytest.skip`` with the reason it cannot load."""
    env = core_env()
    if env.disable_kernels:
        pytest.skip("GLOWLM_DISABLE_KERNELS=1: compiled kernels disabled")
    isa = cpu_isa(live(), requested=KERNEL_ISA.get())
    if isa is None:
        pytest.skip("this CPU has neither AVX-512 (F/BW/VL) nor AVX2+FMA+F16C")
    library = load(isa, env.kernel_cache)
    if library is None:
        pytest.skip(f"the {isa} kernel module could not be built or loaded (see the warning)")
    return library


def vector_width() -> int:
    return VECTOR_WIDTH[require_kernels().isa]
