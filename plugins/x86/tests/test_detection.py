"""x86 detection against recorded hosts (glowlm.testing.hosts)."""

from __future__ import annotations

import pytest
import torch
from glowlm.plugin_api import HostInfo, from_dump
from glowlm.testing.hosts import HOSTS_DIR
from glowlm_x86.platform import X86Platform

HOSTS = HOSTS_DIR  # the recorded hosts glowlm ships (glowlm.testing.hosts)


def host(name: str, *modules: str) -> HostInfo:
    return from_dump(HOSTS / name, frozenset(modules))


def selected(h: HostInfo) -> X86Platform:
    match = X86Platform.detect(h)
    assert match.matched, match.reason
    return X86Platform(h, match)


@pytest.mark.parametrize("name", ["x86_64-zen4-epyc-9r14.cpuinfo",
                                  "x86_64-icelake-xeon-8375c.cpuinfo",
                                  "x86_64-skylake-xeon-8124m.cpuinfo"])
def test_avx512_hosts_take_the_recommended_path(name: str) -> None:
    p = selected(host(name))
    assert p.capabilities.isa == "avx512"
    assert "avx512f" in p.match.reason
    assert not any("AVX2-only" in n for n in p.startup_notes())


@pytest.mark.parametrize("name", ["x86_64-zen3-epyc-milan-live.cpuinfo",
                                  "x86_64-haswell-xeon-e5-2676v3.cpuinfo"])
def test_avx2_hosts_get_the_limited_path_with_a_warning_naming_what_is_limited(name: str
                                                                               ) -> None:
    p = selected(host(name))
    assert p.capabilities.isa == "avx2"
    warning = next(n for n in p.startup_notes() if n.startswith("AVX2-only CPU"))
    assert "AVX-512 kernels are unavailable" in warning and "attention and GEMM" in warning


def test_cpu_without_avx2_is_a_miss_naming_the_missing_flags() -> None:
    match = X86Platform.detect(host("x86_64-ivybridge-xeon-e5-2670v2.cpuinfo"))
    assert not match.matched
    assert "avx2" in match.reason and "avx512f" in match.reason
    assert "avx" in match.reason  # says what the CPU does have


@pytest.mark.parametrize("name,fact", [("aarch64-graviton3-neoverse-v1.cpuinfo", "aarch64"),
                                       ("s390x-z15.cpuinfo", "s390x"),
                                       ("arm64-apple-m2.sysctl", "Darwin")])
def test_other_architectures_miss_naming_what_they_are(name: str, fact: str) -> None:
    match = X86Platform.detect(host(name))
    assert not match.matched and fact in match.reason


def test_flags_are_whole_words() -> None:
    # avx is not avx2, avx512_bf16 is not avx512f
    h = HostInfo(machine="x86_64", system="Linux", flags=frozenset({"avx", "avx512_bf16"}))
    assert not X86Platform.detect(h).matched


def test_amd64_spelling_is_accepted_on_linux() -> None:
    h = HostInfo(machine="AMD64", system="Linux", flags=frozenset({"avx2"}))
    assert X86Platform.detect(h).isa == "avx2"


def test_capabilities_prefer_bfloat16_and_declare_quantization() -> None:
    caps = selected(host("x86_64-icelake-xeon-8375c.cpuinfo")).capabilities
    assert caps.dtypes == (torch.bfloat16, torch.float32, torch.float16)
    assert caps.quantization == ("awq", "gptq", "compressed-tensors", "gguf")
    assert caps.status == "supported"


def test_amd_avx512_without_zentorch_hints_at_the_zen_plugin() -> None:
    notes = selected(host("x86_64-zen4-epyc-9r14.cpuinfo")).startup_notes()
    assert any("pip install glowlm-zen[zentorch]" in n for n in notes)
    with_zentorch = selected(host("x86_64-zen4-epyc-9r14.cpuinfo", "zentorch"))
    assert not any("zentorch" in n for n in with_zentorch.startup_notes())


@pytest.mark.parametrize("name", ["x86_64-icelake-xeon-8375c.cpuinfo",
                                  "x86_64-zen3-epyc-milan-live.cpuinfo"])
def test_no_zentorch_hint_where_zen_cannot_apply(name: str) -> None:
    assert not any("zentorch" in n for n in selected(host(name)).startup_notes())


def test_bfloat16_emulation_is_noted_only_without_native_bf16() -> None:
    icelake = selected(host("x86_64-icelake-xeon-8375c.cpuinfo")).startup_notes()
    zen4 = selected(host("x86_64-zen4-epyc-9r14.cpuinfo", "zentorch")).startup_notes()
    assert any("avx512_bf16" in n for n in icelake)
    assert not any("avx512_bf16" in n for n in zen4)


def test_every_dtype_runs_as_requested() -> None:
    p = selected(host("x86_64-skylake-xeon-8124m.cpuinfo"))
    assert p.resolve_dtype(torch.float16, None) == torch.float16
    assert p.resolve_dtype(torch.float32, "bfloat16") == torch.bfloat16
