"""Core's generic CPU platform: core's pure-PyTorch reference ops, on any CPU torch runs on.

Its ``isa`` label is ``reference``: it has no kernels of its own (torch's dispatch
picks the instructions). "portable" means only glowlm-x86's plain-C++ vector
kernels (``GLOWLM_KERNEL_ISA=portable``), never this platform.

It registers through the same entry-point group as every plugin (``generic`` in
core's pyproject), so it is listed, ranked (lowest) and blockable like them.
"""

from __future__ import annotations

import torch

from glowlm.platforms.host import HostInfo
from glowlm.platforms.interface import Capabilities, Match, Platform
from glowlm.plugins.hookspecs import hookimpl

#: Core's own platform is built for the API it ships (checked like any plugin's).
GLOWLM_PLUGIN_API = "1.1"


class GenericCpuPlatform(Platform):
    """Fallback for any CPU: correct everywhere, fast nowhere in particular."""

    name = "generic"
    rank = 0

    @classmethod
    def detect(cls, host: HostInfo) -> Match:
        return Match(True, f"core's pure-PyTorch reference kernels run on any CPU "
                           f"({host.machine or '?'})", isa="reference")

    @classmethod
    def capabilities_for(cls, host: HostInfo, match: Match) -> Capabilities:
        return Capabilities(isa="reference",
                            dtypes=(torch.float32, torch.bfloat16, torch.float16))

    def startup_notes(self) -> list[str]:
        return ["no hardware plugin matches this CPU (or generic was forced): running core's "
                "pure-PyTorch reference kernels (correct but slow); `glowlm platforms` shows why "
                "each hardware plugin was not chosen"]


@hookimpl
def glowlm_platforms() -> list[type[Platform]]:
    return [GenericCpuPlatform]
