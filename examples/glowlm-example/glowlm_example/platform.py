"""The example platform: any CPU, one compiled op (RMSNorm), core's reference parts otherwise.

A real backend looks for its hardware in :meth:`ExamplePlatform.detect` (a CPU
flag, a vendor string, an importable runtime via ``host.has_module``) and returns
its kernels from ``ops()``, ``attention_backend()`` and
``unquantized_linear_method()``. This one replaces ``rms_norm`` and
``fused_add_rms_norm`` in the :class:`~glowlm.plugin_api.OpsTable` with its compiled
op and keeps core's reference for everything else, so it runs models end to end.

Its rank is 50 (between core's generic platform, 0, and the ISA families, 100)
unless ``GLOWLM_EXAMPLE_RANK`` says otherwise: the variable belongs to this plugin,
declared as a :class:`~glowlm.plugin_api.Setting` (``glowlm platforms`` lists it),
and exists so tests can show a third-party platform winning and losing.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import torch
from glowlm.plugin_api import (
    Capabilities,
    HostInfo,
    Match,
    OpsTable,
    Platform,
    Setting,
    core_env,
    init_logger,
    parse_int,
)

logger = init_logger(__name__)

RANK: Setting[int] = Setting("GLOWLM_EXAMPLE_RANK", "50",
                             "rank of the example platform (50: above generic, below the "
                             "ISA families)", parse_int)


def _built() -> bool:
    """Whether the compiled module was built at install (cheap: no import)."""
    return importlib.util.find_spec("glowlm_example._C") is not None


class ExamplePlatform(Platform):
    """Any CPU; float32 and bfloat16 (what the compiled op is tested with); no quantization."""

    name = "example"
    rank = RANK.get()

    @classmethod
    def detect(cls, host: HostInfo) -> Match:
        # Cheap, no side effects, never raises: answer from the HostInfo only.
        if not host.machine:
            return Match(False, "unknown CPU architecture")
        return Match(True, f"the example platform runs on any CPU ({host.machine})",
                     isa="generic-c++")

    @classmethod
    def capabilities_for(cls, host: HostInfo, match: Match) -> Capabilities:
        from glowlm_example import ops_names

        return Capabilities(isa="generic-c++", dtypes=(torch.float32, torch.bfloat16),
                            kernels=ops_names() if _built() else ())

    def startup_notes(self) -> list[str]:
        if not self.capabilities.kernels:
            return ["the example platform's compiled op was not built (install with "
                    "`pip install --no-build-isolation`); running core's reference ops"]
        return ["the example platform is a template: one compiled op (RMSNorm), core's "
                "reference attention and linear layers"]

    def ops(self) -> OpsTable:
        """Core's reference table with the compiled RMSNorm, unless kernels are disabled."""
        table = super().ops()
        if core_env().disable_kernels or not self.capabilities.kernels:
            self.capabilities = dataclasses.replace(self.capabilities, kernels=())
            return table
        from glowlm_example import ops

        return dataclasses.replace(table, rms_norm=ops.rms_norm,
                                   fused_add_rms_norm=ops.fused_add_rms_norm)
