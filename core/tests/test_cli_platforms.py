"""``glowlm platforms``: what users read to learn which platform runs and why."""

from __future__ import annotations

import json

import pytest
from glowlm.entrypoints.cli.main import main
from glowlm.platforms import host as host_mod
from glowlm.platforms.selection import select_platform
from glowlm.plugins import manager
from glowlm.testing.hosts import HOSTS_DIR

HOSTS = HOSTS_DIR  # glowlm.testing.hosts: the recorded hosts ship with glowlm
FIRST_PARTY = frozenset({"generic", "x86", "zen", "arm", "apple", "s390x"})


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["platforms", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def only_first_party(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Block plugins other than ours (the example plugin may be installed meanwhile)."""
    names = {ep.name for ep in manager._entry_points()}
    monkeypatch.setenv("GLOWLM_PLUGINS_BLOCK", ",".join(sorted(names - FIRST_PARTY)))
    monkeypatch.delenv("GLOWLM_PLATFORM", raising=False)
    return names


def needs(*plugins: str) -> None:
    missing = set(plugins) - {ep.name for ep in manager._entry_points()}
    if missing:
        pytest.skip(f"needs plugin(s) {', '.join(sorted(missing))} installed")


def test_json_describes_a_recorded_zen4_host(capsys: pytest.CaptureFixture[str]) -> None:
    needs("x86", "zen")
    code, out, _ = run(capsys, "--json", "--cpuinfo",
                       str(HOSTS / "x86_64-zen4-epyc-9r14.cpuinfo"), "--assume-module",
                       "zentorch")
    assert code == 0
    data = json.loads(out)
    sel = data["selected"]
    assert {"name", "isa", "dtypes", "quantization", "reason"} <= set(sel)
    assert (sel["name"], sel["isa"], sel["dtypes"]) == ("zen", "avx512", ["bfloat16", "float32"])
    assert "AMD Zen CPU detected with zentorch installed" in data["notes"]
    names = [c["name"] for c in data["candidates"]]
    assert names[0] == "zen" and "generic" in names
    x86 = next(c for c in data["candidates"] if c["name"] == "x86")
    assert x86["distribution"] == "glowlm-x86" and x86["version"] == "0.1.0"
    assert x86["matched"] and x86["quantization"] == ["awq", "gptq", "compressed-tensors",
                                                 "gguf"]


def test_text_has_one_line_per_candidate_and_the_selection(
        capsys: pytest.CaptureFixture[str]) -> None:
    needs("x86")
    code, out, _ = run(capsys, "--cpuinfo", str(HOSTS / "x86_64-icelake-xeon-8375c.cpuinfo"))
    assert code == 0
    assert "selected: x86 (isa avx512" in out
    rows = [line for line in out.splitlines() if line.startswith("  ") and " glowlm" in line]
    listed = {line[4:].split()[0] for line in rows}
    assert listed == {ep.name for ep in manager._entry_points()} & FIRST_PARTY
    assert any(line.startswith("  * x86 ") for line in rows)


def test_a_recorded_mac(capsys: pytest.CaptureFixture[str]) -> None:
    needs("apple")
    code, out, _ = run(capsys, "--sysctl", str(HOSTS / "arm64-apple-m2.sysctl"))
    assert code == 0 and "selected: apple (isa neon, experimental)" in out
    assert "note: the apple platform is experimental" in out


def test_a_bare_architecture_gets_the_generic_platform(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    code, out, _ = run(capsys, "--json", "--machine", "ppc64le")
    assert code == 0 and json.loads(out)["selected"]["name"] == "generic"


def test_forcing_a_platform_that_cannot_run_still_shows_the_table_and_fails(
        capsys: pytest.CaptureFixture[str]) -> None:
    needs("apple")
    code, out, err = run(capsys, "--platform", "apple", "--cpuinfo",
                         str(HOSTS / "aarch64-graviton3-neoverse-v1.cpuinfo"))
    assert code == 2
    assert "apple" in out and "needs macOS" in out
    assert "platform 'apple' cannot run here: needs macOS (Darwin)" in err


def test_forcing_an_unknown_platform_lists_the_valid_ones(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    code, out, err = run(capsys, "--json", "--platform", "tpu", "--machine", "x86_64")
    assert code == 2
    assert json.loads(out)["selected"] is None
    assert "platform 'tpu' is not available; available: " in err and "generic" in err


def test_blocked_plugins_are_listed_as_blocked(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch,
                                               only_first_party: set[str]) -> None:
    needs("zen")
    monkeypatch.setenv("GLOWLM_PLUGINS_BLOCK",
                       ",".join(sorted((only_first_party - FIRST_PARTY) | {"zen"})))
    code, out, _ = run(capsys, "--json", "--cpuinfo",
                       str(HOSTS / "x86_64-zen4-epyc-9r14.cpuinfo"), "--assume-module",
                       "zentorch")
    zen = next(c for c in json.loads(out)["candidates"] if c["name"] == "zen")
    assert code == 0 and zen["reason"] == "blocked by GLOWLM_PLUGINS_BLOCK"


def test_assume_module_needs_a_recorded_host(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--assume-module", "zentorch")
    assert code == 2 and "--cpuinfo" in err


def test_live_host_matches_what_the_process_would_select(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    code, out, _ = run(capsys, "--json")
    assert code == 0
    data = json.loads(out)
    expected = select_platform(host_mod.live(), block=frozenset(
        {ep.name for ep in manager._entry_points()} - FIRST_PARTY))
    assert data["selected"]["name"] == expected.platform.name
    assert all(c["reason"] for c in data["candidates"])
