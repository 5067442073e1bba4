"""collect-env's runtime sections: present, error-free, and saying what a user needs."""

from __future__ import annotations

from glowlm.entrypoints.cli.collect_env import collect, render_text


def test_runtime_sections_are_in_the_report() -> None:
    report = dict(collect())
    for title in ("topology", "thread binding", "numa binding", "allocator and openmp",
                  "kv budget"):
        assert title in report and "error" not in report[title], (title, report.get(title))
    assert report["thread binding"]["offline"].startswith("thread binding auto: rank 0 of 1")
    assert report["numa binding"]["numa_syscalls"] in ("allowed", "forbidden")
    assert "libgomp" in " ".join(report["allocator and openmp"]["openmp_mapped"])
    assert report["kv budget"]["GLOWLM_CPU_KVCACHE_SPACE"] == "4 GiB"
    text = render_text(list(report.items()))
    assert "== allocator and openmp ==" in text and "exact_line:" in text


def test_invalid_binding_setting_is_reported_not_raised(monkeypatch) -> None:
    monkeypatch.setenv("GLOWLM_CPU_OMP_THREADS_BIND", "0-4095")
    report = dict(collect())
    assert report["thread binding"]["offline"].startswith("invalid: ")
    assert "may not use" in report["thread binding"]["offline"]
