"""Rounds of a same-run comparison: several engines measured in turn, N times, as medians.

A shared VM's memory read moves between ~35 and ~66 GB/s from one minute to the next,
and decode follows it, so one figure per engine would compare minutes as much as
engines. The peer benchmarks (``tools/bench_peers.py``, ``tools/bench_quant_peers.py``)
measure every engine once per round, the order reversed every other round
(:func:`round_order`), keep each engine's rounds as one result of medians
(:func:`merge_rounds`) and the two-thread read taken just before each P1
(:func:`read_bandwidth_gbs`), so a reader sees which minute each figure came from.
"""

from __future__ import annotations

import statistics
from typing import Any

#: The figures a round gives, merged across rounds by their median.
ROUND_FIGURES = ("ttft_ms", "decode_tokens_per_s", "output_tokens_per_s", "total_tokens_per_s",
                 "read_bandwidth_gbs")


def merge_rounds(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One engine's rounds as one result: the last successful round's fields with each
    figure replaced by its median over the successful rounds, and the per-round values
    under ``rounds`` (several rounds only). Every round failed: the last error."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return results[-1]
    out = dict(ok[-1])
    if len(results) > 1:
        out["rounds"] = {k: [r.get(k) for r in ok] for k in ROUND_FIGURES
                         if any(isinstance(r.get(k), int | float) for r in ok)}
        for k, values in out["rounds"].items():
            nums = [v for v in values if isinstance(v, int | float)]
            out[k] = statistics.median(nums)
        if len(ok) < len(results):
            out["failed_rounds"] = [r["error"] for r in results if "error" in r]
    return out


def read_bandwidth_gbs() -> float | None:
    """The two-thread read of a 1 GiB array in 2 MiB pages, measured here just before an
    engine's P1: the guest's memory speed moves by up to 1.7x between minutes, and
    decode follows it, so each P1 figure is kept beside the read it ran against."""
    try:
        from glowlm.bench import protocol  # torch: absent where only the tools' Python runs
    except ImportError:
        return None
    return round(protocol.read_bandwidth(repeats=5, huge_pages=True).median_gbs, 2)


def round_order(engines: list[str], round_index: int) -> list[str]:
    """The engines of one round, in reverse order every other round: in a run whose
    memory drifts one way, no engine always goes first."""
    return list(engines) if round_index % 2 == 0 else list(reversed(engines))
