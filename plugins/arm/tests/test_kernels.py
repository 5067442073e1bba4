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


def test_capabilities_list_the_compiled_kernels_where_the_install_built_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ArmPlatform, "kernel_package_dir", tmp_path)
    assert _platform(GRAVITON3).capabilities.kernels == ()  # GLOWLM_BUILD_KERNELS=0
    for stem in ("_kernels_neon", "_kernels_neon_bf16"):  # what pip install leaves
        (tmp_path / f"{stem}.cpython-311-aarch64-linux-gnu.so").write_bytes(b"")
    assert ArmPlatform.built_variants() == ("neon", "neon-bf16")
    assert _platform(GRAVITON3).capabilities.kernels == OP_NAMES + QUANT_OP_NAMES
    assert {"gemv", "gemm", "paged_attention", "rms_norm"} <= set(OP_NAMES)


def test_platforms_says_kernels_not_built_when_the_install_built_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``glowlm platforms`` shows of a Graviton 3 whose install ran with
    GLOWLM_BUILD_KERNELS=0: no kernels listed, and the note says they were not built
    (it never compiles), then what it shows once the modules exist."""
    monkeypatch.setattr(ArmPlatform, "kernel_package_dir", tmp_path)
    monkeypatch.setattr("glowlm.plugin_api.live_host", lambda: from_dump(GRAVITON3))
    p = _platform(GRAVITON3)
    assert p.capabilities.kernels == ()
    assert any(n.startswith("glowlm-arm: kernels not built") for n in p.startup_notes())
    (tmp_path / "_kernels_neon_bf16.cpython-311-aarch64-linux-gnu.so").write_bytes(b"")
    p = _platform(GRAVITON3)
    assert "glowlm-arm: compiled kernels neon-bf16" in p.startup_notes()
    assert p.capabilities.kernels == OP_NAMES + QUANT_OP_NAMES


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
