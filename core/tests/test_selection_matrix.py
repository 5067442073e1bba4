"""What each recorded machine selects, and that every reason names the deciding fact.

One row per recorded host (glowlm.testing.hosts, provenance in its README),
run through the real installed plugins exactly as ``glowlm platforms --cpuinfo``
does. A row needs the plugins its outcome depends on; a CI job that installs only
its own plugin skips the rows it cannot judge. Plugins other than the first-party
ones (e.g. the example plugin while its own test runs) are blocked here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from glowlm.platforms.host import HostInfo, from_dump
from glowlm.platforms.selection import Selection, select_platform
from glowlm.plugins import manager
from glowlm.testing.hosts import HOSTS_DIR

HOSTS = HOSTS_DIR  # glowlm.testing.hosts: the recorded hosts ship with glowlm
FIRST_PARTY = frozenset({"generic", "x86", "zen", "arm", "apple", "s390x"})


@dataclass(frozen=True)
class Row:
    host: str
    expect: str
    isa: str
    #: candidate name -> words its reason must contain (the deciding facts)
    reasons: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: words the selected platform's start-up notes must contain
    notes: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{Path(self.host).stem}{'+' if self.modules else ''}{'+'.join(self.modules)}"


ROWS = [
    Row("x86_64-zen4-epyc-9r14.cpuinfo", "zen", "avx512", modules=("zentorch",),
        reasons={"zen": ("AuthenticAMD", "avx512f", "zentorch"), "x86": ("avx512f",)},
        notes=("AMD Zen CPU detected with zentorch installed",), requires=("x86", "zen")),
    Row("x86_64-zen4-epyc-9r14.cpuinfo", "x86", "avx512",
        reasons={"zen": ("zentorch is not installed", "pip install glowlm-zen[zentorch]"),
                 "x86": ("avx512f",)},
        notes=("zentorch is not installed", "pip install glowlm-zen[zentorch]"),
        requires=("x86", "zen")),
    Row("x86_64-zen3-epyc-milan-live.cpuinfo", "x86", "avx2", modules=("zentorch",),
        reasons={"zen": ("avx512f",), "x86": ("avx2", "avx512f")},
        notes=("AVX2-only CPU", "AVX-512 kernels are unavailable"), requires=("x86", "zen")),
    Row("x86_64-icelake-xeon-8375c.cpuinfo", "x86", "avx512", modules=("zentorch",),
        reasons={"zen": ("GenuineIntel", "AuthenticAMD"), "x86": ("avx512f",)},
        notes=("avx512_bf16",), requires=("x86", "zen")),
    Row("x86_64-skylake-xeon-8124m.cpuinfo", "x86", "avx512",
        reasons={"x86": ("avx512f",), "arm": ("aarch64",)}, requires=("x86",)),
    Row("x86_64-haswell-xeon-e5-2676v3.cpuinfo", "x86", "avx2",
        reasons={"x86": ("avx2",)}, notes=("AVX2-only CPU",), requires=("x86",)),
    Row("x86_64-ivybridge-xeon-e5-2670v2.cpuinfo", "generic", "reference",
        reasons={"x86": ("avx2", "avx512f"), "zen": ("avx2",)},
        notes=("no hardware plugin matches",), requires=("x86", "zen")),
    Row("aarch64-graviton2-neoverse-n1.cpuinfo", "arm", "neon",
        reasons={"arm": ("asimd", "no bf16"), "apple": ("Darwin",), "x86": ("aarch64",)},
        notes=("bf16",), requires=("arm",)),
    Row("aarch64-graviton3-neoverse-v1.cpuinfo", "arm", "neon-bf16",
        reasons={"arm": ("asimd", "bf16"), "apple": ("Darwin",)}, requires=("arm",)),
    Row("arm64-apple-m2.sysctl", "apple", "neon",
        reasons={"apple": ("Darwin", "arm64"), "arm": ("Darwin",), "x86": ("Linux",)},
        notes=("experimental",), requires=("apple",)),
    Row("s390x-z15.cpuinfo", "s390x", "vxe", reasons={"s390x": ("vxe",)},
        notes=("experimental",), requires=("s390x",)),
    Row("s390x-z14.cpuinfo", "s390x", "vxe", reasons={"s390x": ("vxe",)},
        notes=("experimental", "vxe2"), requires=("s390x",)),
    Row("s390x-z13.cpuinfo", "generic", "reference", reasons={"s390x": ("vxe",)},
        notes=("no hardware plugin matches",), requires=("s390x",)),
    Row("ppc64le-power9.cpuinfo", "generic", "reference",
        reasons={name: ("ppc64le",) for name in ("x86", "zen", "arm", "apple", "s390x")}),
    Row("riscv64-sifive-u74.cpuinfo", "generic", "reference",
        reasons={name: ("riscv64",) for name in ("x86", "zen", "arm", "apple", "s390x")}),
]


def installed() -> set[str]:
    return {ep.name for ep in manager._entry_points()}


def select(host: HostInfo, requires: tuple[str, ...]) -> Selection:
    names = installed()
    missing = sorted(set(requires) - names)
    if missing:
        pytest.skip(f"needs plugin(s) {', '.join(missing)} installed")
    return select_platform(host, block=frozenset(names - FIRST_PARTY))


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_recorded_host_selects_the_expected_platform(row: Row) -> None:
    sel = select(from_dump(HOSTS / row.host, frozenset(row.modules)), row.requires)
    assert (sel.platform.name, sel.platform.capabilities.isa) == (row.expect, row.isa), \
        sel.reason
    by_name = {c.name: c for c in sel.candidates}
    for name, words in row.reasons.items():
        if name not in by_name:
            continue  # that plugin is not installed in this job
        for word in words:
            assert word in by_name[name].reason, f"{name}: {by_name[name].reason!r}"
    notes = " | ".join(sel.platform.startup_notes())
    for word in row.notes:
        assert word in notes, notes


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_every_candidate_explains_itself_in_one_line(row: Row) -> None:
    sel = select(from_dump(HOSTS / row.host, frozenset(row.modules)), row.requires)
    assert {c.name for c in sel.candidates} == installed() & FIRST_PARTY
    for c in sel.candidates:
        assert c.reason and "\n" not in c.reason, c
        assert c.matched == (c.capabilities is not None)


# Whole-word flags: a longer flag that contains a shorter one never stands in for it.
WHOLE_WORD = [
    ("x86_64", {"avx", "sse4_2"}, "generic", "x86"),          # avx is not avx2
    ("x86_64", {"avx512_bf16", "avx512_vnni"}, "generic", "x86"),  # ... nor avx512f
    ("aarch64", {"asimd", "svebf16", "avx512_bf16"}, "arm", "arm"),  # neither is bf16
    ("aarch64", {"asimdhp", "asimddp"}, "generic", "arm"),    # asimdhp is not asimd
    ("s390x", {"vx", "vxe2"}, "generic", "s390x"),            # vxe2 is not vxe
]


@pytest.mark.parametrize("machine,flags,expect,plugin", WHOLE_WORD)
def test_flags_are_matched_as_whole_words(machine: str, flags: set[str], expect: str,
                                          plugin: str) -> None:
    sel = select(HostInfo(machine=machine, system="Linux", flags=frozenset(flags),
                          modules=frozenset()), (plugin,))
    assert sel.platform.name == expect
    if expect == "arm":
        assert sel.platform.capabilities.isa == "neon"
