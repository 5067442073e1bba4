"""Apple silicon detection against recorded hosts (glowlm.testing.hosts)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from glowlm.plugin_api import HostInfo, from_dump
from glowlm.testing.hosts import HOSTS_DIR
from glowlm_apple.platform import ApplePlatform

HOSTS = HOSTS_DIR  # the recorded hosts glowlm ships (glowlm.testing.hosts)
M2 = HOSTS / "arm64-apple-m2.sysctl"


def test_m2_matches_as_experimental_neon() -> None:
    h = from_dump(M2)
    match = ApplePlatform.detect(h)
    assert match.matched and match.isa == "neon"
    p = ApplePlatform(h, match)
    assert p.capabilities.status == "experimental"
    assert p.capabilities.dtypes == (torch.float32, torch.float16)
    assert p.capabilities.quantization == ()
    assert any("experimental" in n for n in p.startup_notes())


def test_bfloat16_model_falls_back_to_float32() -> None:
    h = from_dump(M2)
    p = ApplePlatform(h, ApplePlatform.detect(h))
    assert p.resolve_dtype(torch.bfloat16, None) == torch.float32


@pytest.mark.parametrize("name", ["aarch64-graviton3-neoverse-v1.cpuinfo",
                                  "aarch64-graviton2-neoverse-n1.cpuinfo"])
def test_linux_aarch64_never_matches(name: str) -> None:
    match = ApplePlatform.detect(from_dump(HOSTS / name))
    assert not match.matched and "Darwin" in match.reason


def test_rosetta_is_explained() -> None:
    h = from_dump(M2)
    translated = dataclasses.replace(h, machine="x86_64",
                                     sysctl={**h.sysctl, "sysctl.proc_translated": "1"})
    match = ApplePlatform.detect(translated)
    assert not match.matched and "Rosetta" in match.reason


def test_intel_mac_misses() -> None:
    match = ApplePlatform.detect(HostInfo(machine="x86_64", system="Darwin"))
    assert not match.matched and "arm64" in match.reason
