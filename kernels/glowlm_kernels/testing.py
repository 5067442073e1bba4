"""A test platform: glowlm-arm's and glowlm-s390x's Python parts over the x86 build.

Why: those parts (:mod:`glowlm_kernels.parts`: the ops table, the attention backend, the
dense linear method and its measured-choice candidates) are the same code on every CPU
family; only the compiled module under them differs. On an x86 host none of the Arm or
IBM Z modules runs, but glowlm-x86's modules are built from the same tree and register
the same operators (under ``torch.ops.glowlm_x86``), so a platform made of
:class:`~glowlm_kernels.parts.CompiledKernelsPlatform` over them runs the Arm/s390x
Python path on real compiled kernels. The NEON and z/Architecture arithmetic itself is
the cross contract's (kernels/tests/test_cross_kernels.py). Never registered as a plugin.
"""

from __future__ import annotations

from pathlib import Path

import torch
from glowlm.plugin_api import Capabilities, HostInfo, Match, Platform, core_env, live_host

from glowlm_kernels.parts import CompiledKernelsPlatform


def _x86_package() -> Path | None:
    try:
        import glowlm_x86
    except ImportError:
        return None
    return Path(glowlm_x86.__file__).resolve().parent


class SharedPartsOnX86(CompiledKernelsPlatform, Platform):
    """The Arm/s390x mixin over glowlm-x86's installed modules."""

    name = "parts-x86"
    rank = 0
    kernel_plugin = "x86"
    kernel_package_dir = _x86_package() or Path()

    @classmethod
    def kernel_variant(cls, cpu: HostInfo) -> str | None:
        try:
            from glowlm_x86.kernels import cpu_isa
        except ImportError:
            return None
        return cpu_isa(cpu)

    @classmethod
    def detect(cls, host: HostInfo) -> Match:
        ok = host.system == "Linux" and host.machine in ("x86_64", "amd64")
        return Match(ok, "the Arm/s390x parts over the x86 build of the kernel tree", isa="x86")

    @classmethod
    def capabilities_for(cls, host: HostInfo, match: Match) -> Capabilities:
        return Capabilities(
            isa="x86",
            dtypes=(torch.float32, torch.bfloat16),
            quantization=(),
            kernels=cls.installed_kernels(),
        )


def shared_parts_on_x86() -> tuple[SharedPartsOnX86 | None, str]:
    """The platform for this host with its module loaded, or ``(None, why not)``."""
    if _x86_package() is None:
        return None, "glowlm-x86 is not installed: no build of the tree runs on this host"
    if core_env().disable_kernels:
        return None, "GLOWLM_DISABLE_KERNELS=1"
    host = live_host()
    match = SharedPartsOnX86.detect(host)
    platform = SharedPartsOnX86(host, match) if match.matched else None
    if platform is None or platform.compiled() is None:
        return None, "the x86 build of the kernel tree does not load on this host"
    return platform, ""
