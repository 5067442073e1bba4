"""The Arm platform: Linux on aarch64 with NEON (``asimd``), BF16 where the CPU has it.

``bf16`` is the Linux cpuinfo name of ARMv8.6-A FEAT_BF16 (BFDOT/BFMMLA), present
on Neoverse V1/V2/N2 (Graviton 3/4, Grace) and absent on Neoverse N1 (Graviton 2,
Ampere Altra). It is matched as a whole word: ``svebf16`` alone does not count.
"""

from __future__ import annotations

from pathlib import Path

import torch
from glowlm.plugin_api import Capabilities, HostInfo, Match, Platform
from glowlm_kernels.parts import OP_NAMES, CompiledKernelsPlatform
from glowlm_kernels.quant import QUANT_OP_NAMES


class ArmPlatform(CompiledKernelsPlatform, Platform):
    """Linux aarch64 with NEON.

    dtypes: bfloat16 first where the CPU has ``bf16`` (BFCVT rounding in every kernel,
    BFDOT in the 4-bit weight-only one), then float32, float16. Without ``bf16`` the
    list is float32, float16: a bfloat16 model then runs in float32 (with a log line),
    and ``--dtype bfloat16`` is refused, because emulated bfloat16 on such cores is
    slower than float32. Quantization: AWQ, GPTQ, compressed-tensors and GGUF, on the
    module's ``wna16_linear`` / ``w8a8_linear`` (:mod:`glowlm_arm.quant`).

    Kernels: the shared kernel tree compiled at install for NEON (``-march=armv8-a``)
    and NEON + BF16 (``-march=armv8.6-a+bf16``); the live CPU picks the module
    (``neon-bf16`` only where it reports ``bf16``). ``capabilities.kernels`` lists them
    only where the install built the modules (``glowlm platforms`` says "kernels not
    built" otherwise); core's reference ops run when the module cannot load, and the
    list is then emptied. The dense linear method offers the compiled GEMV/GEMM to the
    measured linear choice first, beside oneDNN and ``F.linear``
    (:class:`glowlm_kernels.parts.CompiledLinearMethod`).
    """

    name = "arm"
    rank = 100
    kernel_plugin = "arm"
    kernel_package_dir = Path(__file__).resolve().parent
    kernel_names = OP_NAMES + QUANT_OP_NAMES

    @classmethod
    def kernel_variant(cls, cpu: HostInfo) -> str | None:
        """The kernel module the CPU this process runs on executes (None: not aarch64)."""
        if cpu.machine != "aarch64" or not cpu.has_flag("asimd"):
            return None
        return "neon-bf16" if cpu.has_flag("bf16") else "neon"

    @classmethod
    def detect(cls, host: HostInfo) -> Match:
        if host.system != "Linux" or host.machine != "aarch64":
            return Match(False, f"needs Linux on aarch64; this host is {host.system or '?'} "
                                f"{host.machine or '?'}")
        if not host.has_flag("asimd"):
            return Match(False, "aarch64 CPU without asimd (NEON) in its features")
        if host.has_flag("bf16"):
            return Match(True, "aarch64 CPU with asimd and bf16: NEON path with native "
                               "bfloat16", isa="neon-bf16")
        return Match(True, "aarch64 CPU with asimd but no bf16: NEON path, bfloat16 "
                           "unavailable", isa="neon")

    @classmethod
    def capabilities_for(cls, host: HostInfo, match: Match) -> Capabilities:
        if match.isa == "neon-bf16":
            dtypes = (torch.bfloat16, torch.float32, torch.float16)
        else:
            dtypes = (torch.float32, torch.float16)
        return Capabilities(isa=match.isa or "neon", dtypes=dtypes,
                            quantization=("awq", "gptq", "compressed-tensors", "gguf"),
                            kernels=cls.installed_kernels())

    def startup_notes(self) -> list[str]:
        notes = super().startup_notes()
        notes.append(self.kernel_note())
        if self.capabilities.isa == "neon":
            notes.append("this Arm CPU has no bf16 (ARMv8.6 FEAT_BF16): bfloat16 is not "
                         "supported; bfloat16 models run in float32")
        return notes
