"""The roofline holds each P1 run against the bandwidth read around it."""

from __future__ import annotations

from typing import Any

from glowlm.bench.offline import _roofline
from glowlm.bench.protocol import Bandwidth, LatencyResult


def test_each_run_is_held_against_the_bandwidth_around_it() -> None:
    gb = 1e9
    # Bandwidth drifts 20 -> 40 GB/s; the runs keep pace with it (90 % each), so every
    # per-run fraction is 0.9, although run speeds differ by 2x.
    samples = [Bandwidth(20.0, 21.0), Bandwidth(30.0, 31.0), Bandwidth(40.0, 44.0),
               Bandwidth(40.0, 41.0)]
    wbytes = int(1 * gb)
    runs = [{"decode_tokens_per_s": 0.9 * (a + b) / 2} for a, b in ((20, 30), (30, 40),
                                                                     (40, 40))]
    lat = LatencyResult(ttft_ms=1.0, decode_tokens_per_s=27.0, overhead_fraction=0.0,
                        runs=runs)
    result: dict[str, Any] = {"decode_tokens_per_s": 31.5}
    _roofline(result, lat, samples, wbytes, 0)
    assert result["fraction_of_roofline"] == 0.9
    assert result["read_bandwidth_samples_gbs"] == [20.0, 30.0, 40.0, 40.0]
    assert result["read_bandwidth_gbs"] == 35.0  # median of the samples
    assert result["read_bandwidth_best_gbs"] == 44.0
    assert result["fraction_of_best_read"] == round(31.5 / 44.0, 3)
