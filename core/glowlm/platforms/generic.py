"""Core's portable CPU platform: pure-PyTorch kernels, runs on any CPU torch runs on.

It registers through the same entry-point group as every plugin (``generic`` in
core's pyproject), so it is listed, ranked (lowest) and blockable like them.
"""

from __future__ import annotations

import torch

from glowlm.platforms.host import HostInfo
from glowlm.platforms.interface import Capabilities, Match, Platform
from glowlm.plugins.hookspecs import hookimpl

#: Core's own platform is built for the API it ships (checked like any plugin's).
GLOWLM_PLUGIN_API = "1.0"


class GenericCpuPlatform(Platform):
    """Fallback for any CPU: correct everywhere, fast nowhere in particular."""

    name = "generic"
    rank = 0

    @classmethod
    def detect(cls, host: HostInfo) -> Match:
        return Match(True, f"portable PyTorch kernels run on any CPU ({host.machine or '?'})",
                     isa="portable")

    @classmethod
    def capabilities_for(cls, host: HostInfo, match: Match) -> Capabilities:
        return Capabilities(isa="portable",
                            dtypes=(torch.float32, torch.bfloat16, torch.float16))

    def startup_notes(self) -> list[str]:
        return ["no hardware plugin matches this CPU (or generic was forced): running core's "
                "portable reference kernels (correct but slow); `glowlm platforms` shows why "
                "each hardware plugin was not chosen"]


@hookimpl
def glowlm_platforms() -> list[type[Platform]]:
    return [GenericCpuPlatform]
