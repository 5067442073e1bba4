"""glowlm-s390x's compiled kernels: which module each CPU runs, and the honest fallback.

The kernels themselves (the shared tree's z14 (VXE) and z15 (VXE2) builds) are tested
against core's reference ops under qemu by kernels/tests/test_cross_kernels.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from glowlm.plugin_api import from_dump
from glowlm.testing import contract
from glowlm.testing.hosts import HOSTS_DIR
from glowlm_kernels.parts import OP_NAMES
from glowlm_kernels.quant import QUANT_OP_NAMES
from glowlm_s390x.platform import S390xPlatform

HOSTS = HOSTS_DIR  # the recorded hosts glowlm ships (glowlm.testing.hosts)
Z14 = HOSTS / "s390x-z14.cpuinfo"
Z15 = HOSTS / "s390x-z15.cpuinfo"


def _platform(dump: Path) -> S390xPlatform:
    h = from_dump(dump)
    return S390xPlatform(h, S390xPlatform.detect(h))


def test_capabilities_list_the_compiled_kernels_where_the_install_built_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S390xPlatform, "kernel_package_dir", tmp_path)
    assert _platform(Z15).capabilities.kernels == ()  # GLOWLM_BUILD_KERNELS=0
    monkeypatch.setattr("glowlm.plugin_api.live_host", lambda: from_dump(Z15))
    assert "glowlm-s390x: kernels not built" in _platform(Z15).kernel_note()
    for stem in ("_kernels_z14", "_kernels_z15"):  # what pip install leaves
        (tmp_path / f"{stem}.cpython-311-s390x-linux-gnu.so").write_bytes(b"")
    assert _platform(Z15).capabilities.kernels == OP_NAMES + QUANT_OP_NAMES
    assert _platform(Z15).kernel_note() == "glowlm-s390x: compiled kernels z15"
    assert {"gemv", "gemm", "paged_attention", "rms_norm"} <= set(OP_NAMES)


def test_the_live_cpu_picks_the_variant() -> None:
    assert S390xPlatform.kernel_variant(from_dump(Z15)) == "z15"
    assert S390xPlatform.kernel_variant(from_dump(Z14)) == "z14"
    assert S390xPlatform.kernel_variant(from_dump(HOSTS / "x86_64-icelake-xeon-8375c.cpuinfo")) \
        is None


def test_on_another_cpu_it_runs_the_reference_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ops, attention and the declared quantized methods fall back to core's
    reference where the module cannot run (a z15 recorded, replayed on an x86 CPU)."""
    from glowlm_s390x.quant import quantization_configs

    monkeypatch.setattr("glowlm.plugin_api.live_host", lambda: from_dump(
        HOSTS / "x86_64-icelake-xeon-8375c.cpuinfo"))
    contract.check_reference_fallback(_platform(Z15), quantization_configs())
