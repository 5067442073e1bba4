"""IBM Z detection against recorded hosts (glowlm.testing.hosts)."""

from __future__ import annotations

import pytest
import torch
from glowlm.plugin_api import HostInfo, from_dump
from glowlm.testing.hosts import HOSTS_DIR
from glowlm_s390x.platform import S390xPlatform

HOSTS = HOSTS_DIR  # the recorded hosts glowlm ships (glowlm.testing.hosts)


def selected(h: HostInfo) -> S390xPlatform:
    match = S390xPlatform.detect(h)
    assert match.matched, match.reason
    return S390xPlatform(h, match)


def test_z15_matches_with_vxe_as_experimental() -> None:
    p = selected(from_dump(HOSTS / "s390x-z15.cpuinfo"))
    assert p.capabilities.isa == "vxe" and "vxe" in p.match.reason
    assert p.capabilities.status == "experimental"
    assert p.capabilities.dtypes == (torch.float32, torch.bfloat16, torch.float16)
    assert p.capabilities.quantization == ("awq", "gptq", "compressed-tensors", "gguf")
    notes = [n for n in p.startup_notes() if not n.startswith("glowlm-s390x:")]
    assert notes == ["the s390x platform is experimental"]


def test_z14_has_vxe_and_runs_with_a_note_about_the_target() -> None:
    p = selected(from_dump(HOSTS / "s390x-z14.cpuinfo"))
    assert any("vxe2" in n and "z15" in n for n in p.startup_notes())


def test_z13_has_only_vx_and_misses_naming_vxe() -> None:
    match = S390xPlatform.detect(from_dump(HOSTS / "s390x-z13.cpuinfo"))
    assert not match.matched
    assert match.reason.startswith("needs the vector-enhancements facility (vxe, z15 or newer")


def test_vxe_is_a_whole_word() -> None:
    h = HostInfo(machine="s390x", system="Linux", flags=frozenset({"vx", "vxe2", "vxp"}))
    assert not S390xPlatform.detect(h).matched


@pytest.mark.parametrize("name,fact", [("ppc64le-power9.cpuinfo", "ppc64le"),
                                       ("x86_64-zen4-epyc-9r14.cpuinfo", "x86_64")])
def test_other_hosts_miss(name: str, fact: str) -> None:
    match = S390xPlatform.detect(from_dump(HOSTS / name))
    assert not match.matched and fact in match.reason
