"""glowlm-arm's compiled kernels: which module each CPU runs, and the honest fallback.

The kernels themselves (the shared tree's NEON and NEON+BF16 builds) are tested
against core's reference ops under qemu by kernels/tests/test_cross_kernels.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from glowlm.plugin_api import from_dump
from glowlm.testing import contract
from glowlm.testing.hosts import HOSTS_DIR
from glowlm_arm.platform import ArmPlatform
from glowlm_kernels.parts import OP_NAMES
from glowlm_kernels.quant import QUANT_OP_NAMES

HOSTS = HOSTS_DIR  # the recorded hosts glowlm ships (glowlm.testing.hosts)
GRAVITON2 = HOSTS / "aarch64-graviton2-neoverse-n1.cpuinfo"
GRAVITON3 = HOSTS / "aarch64-graviton3-neoverse-v1.cpuinfo"


def _platform(dump: Path) -> ArmPlatform:
    h = from_dump(dump)
    return ArmPlatform(h, ArmPlatform.detect(h))


def test_capabilities_list_the_compiled_kernels() -> None:
    assert _platform(GRAVITON3).capabilities.kernels == OP_NAMES + QUANT_OP_NAMES
    assert {"gemv", "gemm", "paged_attention", "rms_norm"} <= set(OP_NAMES)


def test_the_live_cpu_picks_the_variant() -> None:
    assert ArmPlatform.kernel_variant(from_dump(GRAVITON3)) == "neon-bf16"
    assert ArmPlatform.kernel_variant(from_dump(GRAVITON2)) == "neon"
    assert ArmPlatform.kernel_variant(from_dump(HOSTS / "x86_64-icelake-xeon-8375c.cpuinfo")) \
        is None


def test_on_another_cpu_it_runs_the_reference_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ops, attention and the declared quantized methods fall back to core's
    reference where the module cannot run (a Graviton 3 recorded, replayed on an x86 CPU)."""
    from glowlm_arm.quant import quantization_configs

    monkeypatch.setattr("glowlm.plugin_api.live_host", lambda: from_dump(
        HOSTS / "x86_64-icelake-xeon-8375c.cpuinfo"))
    contract.check_reference_fallback(_platform(GRAVITON3), quantization_configs())
