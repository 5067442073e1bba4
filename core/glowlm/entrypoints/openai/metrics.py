"""Prometheus metrics for ``GET /metrics``, written in the text exposition format by hand.

Why by hand: prometheus_client is not a core dependency, and the format for a
few gauges, counters and histograms is twenty lines. Names follow vLLM's
(``vllm:`` becomes ``glowlm:``) so existing dashboards port by renaming.

Gauges and token counters come from an :class:`EngineSnapshot` taken in the
engine thread after every engine call, so a scrape never reads the engine while
it is being changed. Latency samples are handed over the same way and only
ever touched on the event loop.
"""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass(frozen=True)
class EngineSnapshot:
    """Engine state read in the engine thread; safe to read anywhere afterwards."""

    num_running: int = 0
    num_waiting: int = 0
    num_unfinished: int = 0
    num_blocks: int = 0
    num_free_blocks: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0


class Histogram:
    def __init__(self, name: str, help: str, buckets: Sequence[float]) -> None:
        self.name, self.help, self.buckets = name, help, tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # last: above every bound (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, values: Iterable[float]) -> None:
        for v in values:
            self.counts[bisect.bisect_left(self.buckets, v)] += 1
            self.sum += v
            self.count += 1

    def render(self, labels: str) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        total = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            total += n
            lines.append(f'{self.name}_bucket{{{labels},le="{bound}"}} {total}')
        lines.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {self.count}')
        lines.append(f"{self.name}_sum{{{labels}}} {self.sum}")
        lines.append(f"{self.name}_count{{{labels}}} {self.count}")
        return lines


class ServerMetrics:
    """Everything ``/metrics`` reports beyond the snapshot's gauges."""

    def __init__(self, model_name: str) -> None:
        self.labels = f'model_name="{_escape(model_name)}"'
        self.histograms = {
            "ttft": Histogram("glowlm:time_to_first_token_seconds",
                              "Time from arrival to the first generated token.", TTFT_BUCKETS),
            "itl": Histogram("glowlm:inter_token_latency_seconds",
                             "Time between consecutive tokens of a request.", ITL_BUCKETS),
            "e2e": Histogram("glowlm:e2e_request_latency_seconds",
                             "Time from arrival to the last token of a request.", E2E_BUCKETS),
        }
        self.finished: Counter[str] = Counter()
        #: Recent end-to-end latencies, for the Retry-After hint of a full queue.
        self.recent_e2e: deque[float] = deque(maxlen=64)

    def observe(self, samples: dict[str, list[float]]) -> None:
        for kind, values in samples.items():
            if kind in self.histograms and values:
                self.histograms[kind].observe(values)
        self.recent_e2e.extend(samples.get("e2e", ()))

    def count_finished(self, reason: str) -> None:
        self.finished[reason] += 1

    def render(self, snap: EngineSnapshot) -> str:
        lab = self.labels
        hit_rate = (snap.prefix_cache_hits / snap.prefix_cache_queries
                    if snap.prefix_cache_queries else 0.0)
        lines: list[str] = []

        def metric(name: str, kind: str, help: str, value: float) -> None:
            lines.extend([f"# HELP {name} {help}", f"# TYPE {name} {kind}",
                          f"{name}{{{lab}}} {value}"])

        metric("glowlm:num_requests_running", "gauge",
               "Sequences in the running batch.", snap.num_running)
        metric("glowlm:num_requests_waiting", "gauge",
               "Sequences waiting to be scheduled.", snap.num_waiting)
        metric("glowlm:kv_cache_usage_perc", "gauge",
               "Fraction of KV cache blocks in use (1 = full).", snap.kv_cache_usage)
        metric("glowlm:num_kv_cache_blocks", "gauge",
               "KV cache blocks in total.", snap.num_blocks)
        metric("glowlm:num_free_kv_cache_blocks", "gauge",
               "KV cache blocks free (cached prefixes included: they are evictable).",
               snap.num_free_blocks)
        metric("glowlm:prefix_cache_queries_total", "counter",
               "Prompt tokens looked up in the prefix cache.", snap.prefix_cache_queries)
        metric("glowlm:prefix_cache_hits_total", "counter",
               "Prompt tokens found in the prefix cache.", snap.prefix_cache_hits)
        metric("glowlm:prefix_cache_hit_rate", "gauge",
               "prefix_cache_hits_total / prefix_cache_queries_total.", hit_rate)
        metric("glowlm:prompt_tokens_total", "counter",
               "Prompt tokens computed (prefix-cache hits excluded).", snap.prompt_tokens)
        metric("glowlm:generation_tokens_total", "counter",
               "Tokens generated.", snap.generation_tokens)
        metric("glowlm:num_preemptions_total", "counter",
               "Sequences preempted because the KV cache was full.", snap.num_preemptions)
        name = "glowlm:request_success_total"
        lines += [f"# HELP {name} Finished requests by finish reason.",
                  f"# TYPE {name} counter"]
        for reason in sorted(set(self.finished) | {"stop", "length", "abort"}):
            lines.append(f'{name}{{{lab},finished_reason="{reason}"}} '
                         f"{self.finished[reason]}")
        for hist in self.histograms.values():
            lines += hist.render(lab)
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
