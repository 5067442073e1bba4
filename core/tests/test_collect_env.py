"""``glowlm collect-env``: sections, their contents, and robustness to a broken probe."""

from __future__ import annotations

import json

import pytest
from glowlm.entrypoints.cli import collect_env
from glowlm.entrypoints.cli.main import main
from glowlm.platforms.host import from_dump
from glowlm.testing.hosts import HOSTS_DIR

HOSTS = HOSTS_DIR  # glowlm.testing.hosts: the recorded hosts ship with glowlm


def test_report_has_the_documented_sections() -> None:
    report = dict(collect_env.collect())
    assert list(report)[:5] == ["versions", "torch", "cpu", "numa", "platform"]
    assert {"openmp", "mkl", "onednn", "cpu_capability"} <= set(report["torch"])
    assert {"logical_cpus", "physical_cores", "flags_present", "flags_absent"} <= set(
        report["cpu"])
    assert "nodes" in report["numa"]
    assert report["platform"]["selected"] and report["platform"]["candidates"]


def test_cpu_flags_that_matter_on_a_recorded_host() -> None:
    ctx = collect_env.EnvContext(host=from_dump(HOSTS / "x86_64-zen4-epyc-9r14.cpuinfo"))
    _, cpu = collect_env.cpu_section(ctx)
    assert cpu["flags_present"].split() == ["avx2", "avx512f", "avx512_bf16"]
    assert "amx_bf16" in cpu["flags_absent"].split()


def test_a_failing_section_is_reported_and_the_rest_still_print(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_section(ctx: collect_env.EnvContext) -> tuple[str, dict[str, object]]:
        raise OSError("no /sys here")

    monkeypatch.setattr(collect_env, "SECTIONS", [broken_section, collect_env.cpu_section])
    report = dict(collect_env.collect())
    assert report["broken"] == {"error": "OSError: no /sys here"}
    assert "cpu" in report


def test_json_and_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collect-env", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["platform"]["selected"]
    assert main(["collect-env"]) == 0
    text = capsys.readouterr().out
    assert "== platform ==" in text and "why:" in text
