"""Arm detection against recorded hosts (glowlm.testing.hosts)."""

from __future__ import annotations

import pytest
import torch
from glowlm.plugin_api import ConfigError, HostInfo, from_dump
from glowlm.testing.hosts import HOSTS_DIR
from glowlm_arm.platform import ArmPlatform

HOSTS = HOSTS_DIR  # the recorded hosts glowlm ships (glowlm.testing.hosts)


def selected(h: HostInfo) -> ArmPlatform:
    match = ArmPlatform.detect(h)
    assert match.matched, match.reason
    return ArmPlatform(h, match)


def test_graviton2_neoverse_n1_is_neon_without_bfloat16() -> None:
    p = selected(from_dump(HOSTS / "aarch64-graviton2-neoverse-n1.cpuinfo"))
    assert p.capabilities.isa == "neon"
    assert p.capabilities.dtypes == (torch.float32, torch.float16)
    assert "bf16" in p.match.reason
    assert any("bf16" in n for n in p.startup_notes())
    assert p.capabilities.quantization == ("awq", "gptq", "compressed-tensors", "gguf")


def test_graviton3_neoverse_v1_has_native_bfloat16_first() -> None:
    p = selected(from_dump(HOSTS / "aarch64-graviton3-neoverse-v1.cpuinfo"))
    assert p.capabilities.isa == "neon-bf16"
    assert p.capabilities.dtypes == (torch.bfloat16, torch.float32, torch.float16)
    assert [n for n in p.startup_notes() if not n.startswith("glowlm-arm:")] == []


def test_bfloat16_without_bf16_is_refused_when_asked_and_replaced_when_from_the_model(
) -> None:
    p = selected(from_dump(HOSTS / "aarch64-graviton2-neoverse-n1.cpuinfo"))
    with pytest.raises(ConfigError, match="bfloat16 is not supported on the arm platform"):
        p.resolve_dtype(torch.float32, "bfloat16")
    assert p.resolve_dtype(torch.bfloat16, None) == torch.float32


def test_bf16_is_a_whole_word() -> None:
    # SVE's svebf16 (or an x86 name) does not make a CPU FEAT_BF16-capable.
    h = HostInfo(machine="aarch64", system="Linux",
                 flags=frozenset({"asimd", "svebf16", "avx512_bf16"}))
    assert ArmPlatform.detect(h).isa == "neon"


def test_aarch64_without_asimd_misses_naming_asimd() -> None:
    match = ArmPlatform.detect(HostInfo(machine="aarch64", system="Linux",
                                        flags=frozenset({"fp"})))
    assert not match.matched and "asimd" in match.reason


@pytest.mark.parametrize("name,fact", [("arm64-apple-m2.sysctl", "Darwin"),
                                       ("x86_64-zen4-epyc-9r14.cpuinfo", "x86_64"),
                                       ("ppc64le-power9.cpuinfo", "ppc64le")])
def test_other_hosts_miss(name: str, fact: str) -> None:
    match = ArmPlatform.detect(from_dump(HOSTS / name))
    assert not match.matched and fact in match.reason
