"""glowlm-x86's environment variables, declared through the ``glowlm_settings`` hook.

They belong to this plugin, not to core's ``envs.py``: ``glowlm platforms`` lists them
with the plugin's name and docs/configuration.md has their rows.
"""

from __future__ import annotations

from glowlm.plugin_api import Setting, parse_str

#: Pin the kernel build (``avx512``, ``avx2`` or ``portable``); unset: the best this CPU
#: runs. Validated where it is used (:func:`glowlm_x86.kernels.cpu_isa`), against the CPU.
KERNEL_ISA: Setting[str | None] = Setting(
    "GLOWLM_KERNEL_ISA", "",
    "pin the x86 kernel build: avx512-bf16, avx512, avx2 or portable (plain C++ vectors, "
    "the porting reference; slow); default: the best this CPU runs", parse_str)

SETTINGS = [KERNEL_ISA]
