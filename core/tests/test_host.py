"""Reading hosts: recorded /proc/cpuinfo and sysctl dumps, NUMA from /sys, module probing."""

from __future__ import annotations

from pathlib import Path

import pytest
from glowlm.errors import ConfigError
from glowlm.platforms.host import (
    HostInfo,
    from_dump,
    from_files,
    guess_machine,
    parse_cpuinfo,
    read_numa_nodes,
)
from glowlm.testing.hosts import HOSTS_DIR

HOSTS = HOSTS_DIR  # glowlm.testing.hosts: the recorded hosts ship with glowlm

# file, machine, vendor, model name (substring), logical CPUs, physical cores, flags present
EXPECTED = [
    ("x86_64-zen4-epyc-9r14.cpuinfo", "x86_64", "AuthenticAMD", "EPYC 9R14", 4, 4,
     {"avx512f", "avx512_bf16", "avx2"}),
    ("x86_64-zen3-epyc-milan-live.cpuinfo", "x86_64", "AuthenticAMD", "AMD EPYC", 2, 2,
     {"avx2", "vaes"}),
    ("x86_64-icelake-xeon-8375c.cpuinfo", "x86_64", "GenuineIntel", "8375C", 4, 2,
     {"avx512f", "avx512_vnni"}),
    ("x86_64-skylake-xeon-8124m.cpuinfo", "x86_64", "GenuineIntel", "8124M", 2, 1,
     {"avx512f", "avx512bw"}),
    ("x86_64-haswell-xeon-e5-2676v3.cpuinfo", "x86_64", "GenuineIntel", "E5-2676 v3", 2, 1,
     {"avx2", "fma"}),
    ("x86_64-ivybridge-xeon-e5-2670v2.cpuinfo", "x86_64", "GenuineIntel", "E5-2670 v2", 2, 1,
     {"avx", "sse4_2"}),
    ("aarch64-graviton2-neoverse-n1.cpuinfo", "aarch64", "ARM", "Neoverse-N1", 2, 2,
     {"asimd", "asimddp"}),
    ("aarch64-graviton3-neoverse-v1.cpuinfo", "aarch64", "ARM", "Neoverse-V1", 2, 2,
     {"asimd", "bf16", "sve", "svebf16"}),
    ("s390x-z15.cpuinfo", "s390x", "IBM/S390", "z15", 2, 2, {"vx", "vxe", "vxe2"}),
    ("s390x-z14.cpuinfo", "s390x", "IBM/S390", "z14", 2, 2, {"vx", "vxe"}),
    ("s390x-z13.cpuinfo", "s390x", "IBM/S390", "z13", 2, 2, {"vx"}),
    ("ppc64le-power9.cpuinfo", "ppc64le", "IBM", "POWER9", 4, 4, {"altivec"}),
    ("riscv64-sifive-u74.cpuinfo", "riscv64", "", "sifive,u74-mc", 4, 4,
     {"i", "m", "a", "f", "d", "c", "zba", "zbb"}),
]


@pytest.mark.parametrize("name,machine,vendor,model,logical,physical,flags", EXPECTED)
def test_recorded_cpuinfo_dumps_parse(name: str, machine: str, vendor: str, model: str,
                                      logical: int, physical: int, flags: set[str]) -> None:
    h = from_dump(HOSTS / name)
    assert (h.machine, h.system, h.vendor) == (machine, "Linux", vendor)
    assert model in h.model_name
    assert (h.logical_cpus, h.physical_cores) == (logical, physical)
    assert flags <= h.flags
    assert h.modules == frozenset()  # a recorded host never probes this interpreter


def test_absent_flags_stay_absent() -> None:
    assert "avx512f" not in from_dump(HOSTS / "x86_64-zen3-epyc-milan-live.cpuinfo").flags
    assert "bf16" not in from_dump(HOSTS / "aarch64-graviton2-neoverse-n1.cpuinfo").flags
    assert "vxe" not in from_dump(HOSTS / "s390x-z13.cpuinfo").flags
    assert "v" not in from_dump(HOSTS / "riscv64-sifive-u74.cpuinfo").flags


def test_flags_match_whole_words_only() -> None:
    info = parse_cpuinfo("processor : 0\nflags : avx avx512_bf16 svebf16\n")
    h = HostInfo(machine="x86_64", system="Linux", flags=info["flags"])  # type: ignore[arg-type]
    assert h.has_flag("avx") and h.has_flag("AVX512_BF16")
    assert not h.has_flag("avx2") and not h.has_flag("bf16") and not h.has_flag("avx512f")


def test_apple_sysctl_dump() -> None:
    h = from_dump(HOSTS / "arm64-apple-m2.sysctl")
    assert (h.machine, h.system, h.vendor, h.model_name) == ("arm64", "Darwin", "Apple",
                                                            "Apple M2")
    assert {"asimd", "neon", "bf16", "i8mm", "fp16"} <= h.flags
    assert "sme" not in h.flags  # hw.optional.arm.FEAT_SME: 0
    assert (h.logical_cpus, h.physical_cores) == (8, 8)
    assert h.sysctl["hw.optional.arm.FEAT_BF16"] == "1"


@pytest.mark.parametrize("name", [e[0] for e in EXPECTED])
def test_architecture_is_inferred_from_the_dump(name: str) -> None:
    assert guess_machine((HOSTS / name).read_text()) == name.split("-")[0]


def test_explicit_machine_and_system_win_over_inference() -> None:
    h = from_files(cpuinfo=str(HOSTS / "x86_64-haswell-xeon-e5-2676v3.cpuinfo"),
                   machine="x86_64", system="Darwin")
    assert h.system == "Darwin"


def test_unknown_dump_asks_for_the_machine(tmp_path: Path) -> None:
    dump = tmp_path / "odd.cpuinfo"
    dump.write_text("processor : 0\nsomething : else\n")
    with pytest.raises(ConfigError, match="--machine"):
        from_files(cpuinfo=str(dump))
    assert from_files(cpuinfo=str(dump), machine="loongarch64").machine == "loongarch64"


def test_missing_dump_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.cpuinfo"):
        from_files(cpuinfo=str(tmp_path / "nope.cpuinfo"))


def test_recorded_modules_are_assumed_not_probed() -> None:
    h = from_dump(HOSTS / "x86_64-zen4-epyc-9r14.cpuinfo", frozenset({"zentorch"}))
    assert h.has_module("zentorch") and not h.has_module("json")


def test_live_hosts_probe_the_interpreter() -> None:
    h = HostInfo(machine="x86_64", system="Linux")
    assert h.has_module("json")
    assert not h.has_module("glowlm_no_such_module_xyz")


def test_numa_nodes_from_sysfs(tmp_path: Path) -> None:
    for node, cpus, kib in ((0, "0-3,8", 1024), (1, "4-7", 2048)):
        d = tmp_path / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
        (d / "meminfo").write_text(f"Node {node} MemTotal:       {kib} kB\n")
    nodes = read_numa_nodes(str(tmp_path))
    assert [(n.id, n.cpus, n.memory_bytes) for n in nodes] == [
        (0, (0, 1, 2, 3, 8), 1024 * 1024), (1, (4, 5, 6, 7), 2048 * 1024)]
    assert read_numa_nodes(str(tmp_path / "missing")) == ()
