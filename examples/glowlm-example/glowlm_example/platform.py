"""The example platform: matches any CPU and runs core's reference kernels.

A real backend would look for its hardware in :meth:`ExamplePlatform.detect`
(a CPU flag, a vendor string, an importable runtime via ``host.has_module``)
and override ``attention_backend()``, ``ops()`` or ``unquantized_linear_method()``
with its kernels. Its rank is fixed at 50 (between core's generic platform, 0,
and the ISA families, 100) unless ``GLOWLM_EXAMPLE_RANK`` says otherwise: the
variable belongs to this plugin, not to glowlm, and exists so tests can show a
third-party platform winning and losing.
"""

from __future__ import annotations

import os

import torch
from glowlm.platforms.host import HostInfo
from glowlm.platforms.interface import Capabilities, Match, Platform


def _rank() -> int:
    raw = os.environ.get("GLOWLM_EXAMPLE_RANK", "50")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"GLOWLM_EXAMPLE_RANK={raw!r} is not an integer") from None


class ExamplePlatform(Platform):
    """Any CPU, float32 and bfloat16, no quantization, core's reference kernels."""

    name = "example"
    rank = _rank()

    @classmethod
    def detect(cls, host: HostInfo) -> Match:
        # Cheap, no side effects, never raises: answer from the HostInfo only.
        if not host.machine:
            return Match(False, "unknown CPU architecture")
        return Match(True, f"the example platform runs on any CPU ({host.machine})",
                     isa="reference")

    @classmethod
    def capabilities_for(cls, host: HostInfo, match: Match) -> Capabilities:
        return Capabilities(isa="reference", dtypes=(torch.float32, torch.bfloat16))

    def startup_notes(self) -> list[str]:
        return ["the example platform is a template: it runs core's reference kernels"]
