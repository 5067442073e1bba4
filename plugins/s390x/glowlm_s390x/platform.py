"""The IBM Z platform: Linux on s390x with the vector-enhancements facility (``vxe``).

``vxe`` (vector-enhancements facility 1, which adds single-precision vector
floating point) is what torch's s390x vector kernels need; ``vx`` alone (z13)
is not enough. The kernel prints ``vxe`` from z14 on and adds ``vxe2`` on z15;
the supported target is z15 or newer, so a z14 runs with a note.
"""

from __future__ import annotations

from pathlib import Path

import torch
from glowlm.plugin_api import Capabilities, HostInfo, Match, Platform
from glowlm_kernels.parts import OP_NAMES, CompiledKernelsPlatform
from glowlm_kernels.quant import QUANT_OP_NAMES

NO_VXE = ("needs the vector-enhancements facility (vxe, z15 or newer; z14 also has it); "
          "this CPU's features lack vxe")


class S390xPlatform(CompiledKernelsPlatform, Platform):
    """Linux s390x with vxe. Experimental.

    dtypes: float32 first (the fallback), bfloat16, float16, all supported. The
    quantization methods are those of x86 (AWQ, GPTQ, compressed-tensors, GGUF),
    registered by :mod:`glowlm_s390x.quant`, on the compiled module's ``wna16_linear`` /
    ``w8a8_linear``. Kernels are listed only where the install built them; the dense
    linear method offers the compiled GEMV/GEMM to the measured linear choice first.
    """

    name = "s390x"
    rank = 100
    kernel_plugin = "s390x"
    kernel_package_dir = Path(__file__).resolve().parent
    kernel_names = OP_NAMES + QUANT_OP_NAMES

    @classmethod
    def kernel_variant(cls, cpu: HostInfo) -> str | None:
        """The module the live CPU runs: z15 (VXE2) where it has vxe2, else z14 (VXE)."""
        if cpu.machine != "s390x" or not cpu.has_flag("vxe"):
            return None
        return "z15" if cpu.has_flag("vxe2") else "z14"

    @classmethod
    def detect(cls, host: HostInfo) -> Match:
        if host.system != "Linux" or host.machine != "s390x":
            return Match(False, f"needs Linux on s390x (IBM Z); this host is "
                                f"{host.system or '?'} {host.machine or '?'}")
        if not host.has_flag("vxe"):
            return Match(False, NO_VXE)
        return Match(True, "s390x CPU with vxe (vector-enhancements facility): "
                           "z/Architecture vector path, experimental", isa="vxe")

    @classmethod
    def capabilities_for(cls, host: HostInfo, match: Match) -> Capabilities:
        return Capabilities(isa="vxe", dtypes=(torch.float32, torch.bfloat16, torch.float16),
                            quantization=("awq", "gptq", "compressed-tensors", "gguf"),
                            kernels=cls.installed_kernels(), status="experimental")

    def startup_notes(self) -> list[str]:
        notes = super().startup_notes()
        notes.append(self.kernel_note())
        if not self.host.has_flag("vxe2"):
            notes.append("this IBM Z has vxe but not vxe2 (z14): the tested target is "
                         "z15 or newer")
        return notes
