"""The Apple silicon platform: macOS (Darwin) on arm64, experimental.

Detection reads ``sysctl -a`` (``hw.optional.*`` keys) rather than
``/proc/cpuinfo``, which macOS lacks. Linux on aarch64 (Graviton, or Asahi
Linux on a Mac) is the Arm platform's, never this one's.
"""

from __future__ import annotations

import torch
from glowlm.plugin_api import Capabilities, HostInfo, Match, Platform

EXPERIMENTAL_NOTE = ("the apple platform is experimental: Apple silicon runs core's CPU "
                     "reference kernels (NEON through torch, no Metal; glowlm's compiled "
                     "kernel tree is not built for macOS yet, Apple clang has no OpenMP); "
                     "expect gaps")


class ApplePlatform(Platform):
    """macOS on Apple silicon.

    dtypes: float32 first (the fallback, so a bfloat16 model runs in float32 with a
    log line), then float16. bfloat16 is not offered even on M2+ (which has
    FEAT_BF16) until it is tested there.
    """

    name = "apple"
    rank = 100

    @classmethod
    def detect(cls, host: HostInfo) -> Match:
        if host.system != "Darwin":
            return Match(False, f"needs macOS (Darwin) on arm64; this host runs "
                                f"{host.system or '?'} on {host.machine or '?'}")
        if host.sysctl.get("sysctl.proc_translated") == "1":
            return Match(False, "Python runs under Rosetta 2 (x86_64 emulation) on Apple "
                                "silicon; install an arm64 Python")
        if host.machine != "arm64":
            return Match(False, f"needs Apple silicon (arm64); this Mac is {host.machine}")
        if not host.has_flag("asimd"):
            return Match(False, "sysctl reports hw.optional.neon: 0 (no NEON)")
        return Match(True, "macOS on Apple silicon (Darwin arm64, hw.optional.neon): "
                           "NEON path, experimental", isa="neon")

    @classmethod
    def capabilities_for(cls, host: HostInfo, match: Match) -> Capabilities:
        return Capabilities(isa="neon", dtypes=(torch.float32, torch.float16),
                            status="experimental")

    def startup_notes(self) -> list[str]:
        return [EXPERIMENTAL_NOTE]
