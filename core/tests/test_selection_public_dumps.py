"""Selection on real machines' recorded CPU descriptions published by archspec.

archspec (a dependency of glowlm core) ships, as its own test data, ``/proc/cpuinfo``
and ``sysctl -a`` dumps recorded on real machines (``archspec/json/tests/targets``,
Apache-2.0/MIT). They are read in place from the installed package, never copied:
each row names the dump, the platform that must win and the fact the reason names.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from glowlm.platforms.host import from_dump
from glowlm.platforms.selection import select_platform

archspec = pytest.importorskip("archspec")
TARGETS = Path(archspec.__file__).parent / "json" / "tests" / "targets"
OURS = frozenset({"generic", "x86", "zen", "arm", "s390x", "apple"})

CASES = [
    # dump, importable modules, expected platform, expected isa, fact in the reason
    ("linux-rhel7-skylake_avx512", (), "x86", "avx512", "avx512f"),
    ("linux-centos7-cascadelake", (), "x86", "avx512", "avx512f"),
    ("linux-unknown-sapphirerapids", (), "x86", "avx512", "avx512f"),
    ("linux-rhel7-haswell", (), "x86", "avx2", "avx2"),
    ("linux-ubuntu20.04-zen3", (), "x86", "avx2", "avx2"),
    ("linux-rocky8.5-zen4", (), "x86", "avx512", "avx512f"),
    ("linux-rocky8.5-zen4", ("zentorch",), "zen", None, "zentorch"),
    ("linux-rhel7-ivybridge", (), "generic", "reference", "reference"),
    ("linux-amazon-neoverse_n1", (), "arm", "neon", "asimd"),
    ("linux-amazon-neoverse_v1", (), "arm", "neon-bf16", "bf16"),
    ("linux-rhel8-power9", (), "generic", "reference", "reference"),
    ("linux-sifive-u74mc", (), "generic", "reference", "reference"),
    ("darwin-monterey-m2", (), "apple", None, "arm64"),
    ("darwin-mojave-skylake", (), "generic", "reference", "reference"),
]


@pytest.mark.parametrize("dump,modules,platform,isa,fact", CASES,
                         ids=[f"{c[0]}{'+' + ','.join(c[1]) if c[1] else ''}" for c in CASES])
def test_real_dump_selects_expected_platform(dump, modules, platform, isa, fact):
    path = TARGETS / dump
    if not path.exists():
        pytest.skip(f"this archspec release does not ship {dump}")
    host = from_dump(path, modules=frozenset(modules))
    selection = select_platform(host)
    chosen = selection.platform
    if chosen.name not in OURS:
        pytest.skip(f"a third-party platform {chosen.name!r} is installed")
    assert chosen.name == platform, selection.reason
    if isa is not None:
        assert chosen.capabilities.isa == isa
    assert fact in selection.reason.lower() or any(
        fact in c.reason.lower() for c in selection.candidates if c.name == platform), \
        selection.reason
