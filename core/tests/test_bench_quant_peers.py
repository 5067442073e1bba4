"""tools/bench_quant_peers.py's own logic: the bar's ratios, failures kept as rows, refusals.

The engines themselves (glowlm on 1 B checkpoints, vLLM CPU, llama.cpp) only run in the
benchmark (``make bench-peers-quant``), never here: these check what the tool computes
from their figures and that one failing engine is recorded, not fatal.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bq() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_quant_peers",
                                                  REPO / "tools/bench_quant_peers.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _e(ttft: float, decode: float) -> dict[str, float]:
    return {"ttft_ms": ttft, "decode_tokens_per_s": decode}


def test_bar_ratios_thresholds_and_verdicts(bq: ModuleType) -> None:
    results = {"bf16": {"glowlm": _e(100, 10), "vllm": _e(120, 8), "llama.cpp": _e(300, 12)},
               "W4A16 g128": {"glowlm": _e(150, 30), "vllm": _e(200, 20),
                              "llama.cpp": _e(250, 40)},
               "W8A8": {"glowlm": _e(80, 15), "vllm": {"error": "boom"},
                        "llama.cpp": _e(260, 20)}}
    checks = {c["check"]: c for c in bq.bar_checks(results)}
    w4 = checks["W4A16 decode / glowlm bf16 decode"]
    assert w4["ratio"] == pytest.approx(3.0) and w4["threshold"] == 2.5 and w4["passed"]
    q4 = checks["W4A16 decode / llama.cpp Q4_0 decode"]
    assert q4["ratio"] == pytest.approx(0.75) and q4["passed"] is False
    w8 = checks["W8A8 decode / glowlm bf16 decode"]
    assert w8["ratio"] == pytest.approx(1.5) and w8["passed"] is False
    ttft = checks["glowlm bf16 TTFT / W8A8 TTFT (W8A8 TTFT <= bf16)"]
    assert ttft["ratio"] == pytest.approx(100 / 80) and ttft["passed"]
    same = checks["W4A16 g128 decode / vLLM CPU on the same checkpoint"]
    assert same["ratio"] == pytest.approx(1.5) and same["passed"]
    failed = checks["W8A8 decode / vLLM CPU on the same checkpoint"]
    assert failed["ratio"] is None and failed["passed"] is None   # vLLM failed: missing
    assert "GPTQ W4A16 g128 decode / vLLM CPU on the same checkpoint" not in checks
    info = checks["W8A8 decode / llama.cpp Q8_0 decode"]
    assert info["ratio"] == pytest.approx(0.75) and info["threshold"] is None


def test_a_failing_engine_becomes_an_error_row(bq: ModuleType) -> None:
    code = "import sys; print('loading', file=sys.stderr); " \
           "raise ValueError('Unsupported quantization scheme')"
    r = bq.run_json([sys.executable, "-c", code], {}, "x")
    assert r["exit_code"] == 1
    assert r["error"] == "ValueError: Unsupported quantization scheme"
    ok = bq.run_json([sys.executable, "-c", "print('log'); print('{\"ttft_ms\": 5}')"], {}, "x")
    assert ok == {"ttft_ms": 5}
    code = ("import sys; print('WARNING glowlm: kernels unavailable', file=sys.stderr); "
            "print('INFO glowlm: x', file=sys.stderr); print('{\"ttft_ms\": 5}')")
    warned = bq.run_json([sys.executable, "-c", code], {}, "x")
    assert warned == {"ttft_ms": 5, "warnings": ["WARNING glowlm: kernels unavailable"]}


def test_table_marks_failures_and_verdicts(bq: ModuleType, capsys: pytest.CaptureFixture
                                           ) -> None:
    by_group = {"bf16": {"glowlm": {"checkpoint": "llama-1b-rand", **_e(100, 10),
                                    "platform": "x86", "isa": "avx512",
                                    "warnings": ["WARNING glowlm: slow path"]}},
                "W4A16 g128": {"glowlm": {"checkpoint": "llama-1b-rand-w4a16-g128",
                                          **_e(90, 30)},
                               "vllm": {"checkpoint": "llama-1b-rand-w4a16-g128",
                                        "error": "RuntimeError: no kernel"}}}
    report = {"host": {"cpu": "CPU X", "logical_cpus": 2, "flags_that_matter": ["avx2"]},
              "threads": 2, "protocol": {"input_len": 128, "output_len": 128, "num_iters": 3,
                                         "p2": False, "num_prompts": 32},
              "results": [{"dtype": g, "engines": e} for g, e in by_group.items()],
              "bar": bq.bar_checks(by_group)}
    bq.print_table(report)
    out = capsys.readouterr().out
    assert "host: CPU X (2 CPUs); flags: avx2; threads=2" in out
    assert "FAILED: RuntimeError: no kernel" in out
    assert "W4A16 decode / glowlm bf16 decode" in out and "PASS" in out
    assert "(missing)" in out                    # no W8A8 figures
    assert "x86/avx512" in out and "glowlm: WARNING glowlm: slow path" in out
    assert "note: not the bar's protocol" not in out


def test_missing_checkpoints_are_one_line(bq: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="make bench-models"):
        bq.main([str(tmp_path)])
    (tmp_path / "llama-1b-rand").mkdir()
    (tmp_path / "llama-1b-rand" / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="llama-1b-rand-w4a16-g128, llama-1b-rand-w8a8-"
                                         "dynamic .*make bench-models-quant"):
        bq.main([str(tmp_path)])


def test_rounds_merge_to_medians_and_keep_failures(bq: ModuleType) -> None:
    """Several rounds give one result per engine and checkpoint: medians of each figure,
    the per-round values beside them, failed rounds named; all failed: the error."""
    merged = bq.merge_rounds([{**_e(100, 10), "platform": "x86"}, _e(90, 30),
                              {"error": "killed"}, _e(95, 20)])
    assert (merged["ttft_ms"], merged["decode_tokens_per_s"]) == (95, 20)
    assert merged["rounds"] == {"ttft_ms": [100, 90, 95], "decode_tokens_per_s": [10, 30, 20]}
    assert merged["failed_rounds"] == ["killed"]
    assert bq.merge_rounds([_e(1, 2)]) == _e(1, 2)  # one round: as measured
    assert bq.merge_rounds([{"error": "a"}, {"error": "b"}]) == {"error": "b"}
