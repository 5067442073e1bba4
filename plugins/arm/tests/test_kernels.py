"""glowlm-arm's compiled kernels: which module each CPU runs, and the honest fallback.

The kernels themselves (the shared tree's NEON and NEON+BF16 builds) are tested
against core's reference ops under qemu by kernels/tests/test_cross_kernels.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from glowlm.plugin_api import from_dump
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


def test_a_recorded_host_on_another_cpu_runs_reference_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Graviton 3 recorded, replayed on an x86 CPU: its NEON module cannot run here.
    monkeypatch.setattr("glowlm.platforms.host.live", lambda: from_dump(
        HOSTS / "x86_64-icelake-xeon-8375c.cpuinfo"))
    p = _platform(GRAVITON3)
    assert p.ops().replaced() == []
    assert p.attention_backend().name == "reference"
    assert p.capabilities.kernels == ()
    assert any("core's reference ops" in n for n in p.startup_notes())


def test_quantized_methods_fall_back_to_the_reference_where_the_module_cannot_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The methods are declared; on a CPU that cannot run this module (this recorded host
    replayed here) they run core's reference matmuls, never a missing op."""
    from glowlm.plugin_api import REFERENCE_QUANT_KERNELS
    from glowlm_arm.quant import quantization_configs

    monkeypatch.setattr("glowlm.platforms.host.live", lambda: from_dump(
        HOSTS / "x86_64-icelake-xeon-8375c.cpuinfo"))
    p = _platform(GRAVITON3)
    configs = quantization_configs()
    assert {c.name for c in configs} >= set(p.capabilities.quantization)
    for cls in configs:
        assert cls.supports(p)
        config = cls.__new__(cls)
        config.platform = p
        assert config.kernels() is REFERENCE_QUANT_KERNELS
