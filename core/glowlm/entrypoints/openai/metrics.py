"""Prometheus metrics for ``GET /metrics``, through ``prometheus_client``.

Every metric is exposed twice: with vLLM's names (``vllm:...``), so an existing
vLLM Grafana dashboard works unchanged, and with the same names under
``glowlm:``. Label ``model_name`` as vLLM's. ``process_*`` / ``python_*``
metrics come from prometheus_client's standard collectors.

Gauges and engine counters come from an :class:`EngineSnapshot` taken in the
engine thread after every engine call (a custom collector reads it at scrape
time), so a scrape never reads the engine while it is being changed.
Per-request samples (latencies, queue / prefill / decode times, token counts)
are handed over from the engine thread with each step and observed into
histograms on the event loop. ``prompt_tokens_total`` counts every prompt
token, prefix-cache hits included, as vLLM does; ``glowlm:prompt_tokens_computed_total``
counts only those the model computed.

Every 10 s while requests run, one log line gives vLLM's "Avg prompt
throughput / Avg generation throughput" summary (``--disable-log-stats``: none).

With ``--speculative-config``, vLLM's speculative-decoding counters appear too
(``spec_decode_num_drafts``, ``_num_draft_tokens``, ``_num_accepted_tokens`` and
``_num_accepted_tokens_per_pos`` with a ``position`` label), and a second log line
gives the mean acceptance length and acceptance rate since the last one.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from glowlm.logger import init_logger

logger = init_logger(__name__)

CONTENT_TYPE = CONTENT_TYPE_LATEST
PREFIXES = ("vllm", "glowlm")
#: Seconds between two "Avg prompt throughput" log lines (vLLM's interval).
LOG_INTERVAL = 10.0

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
#: vLLM's buckets for request_prompt_tokens / request_generation_tokens (1-2-5 steps).
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
                 100000)

#: Sample kind (as the engine hands it over) -> (metric name, help, buckets).
HISTOGRAMS: dict[str, tuple[str, str, Sequence[float]]] = {
    "ttft": ("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
             TTFT_BUCKETS),
    "itl": ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS),
    "tpot": ("time_per_output_token_seconds",
             "Histogram of time per output token in seconds (per request, after the first).",
             ITL_BUCKETS),
    "e2e": ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            E2E_BUCKETS),
    "queue": ("request_queue_time_seconds",
              "Histogram of time spent waiting before the first step of a request.",
              E2E_BUCKETS),
    "prefill": ("request_prefill_time_seconds",
                "Histogram of time from the first step of a request to its first token.",
                E2E_BUCKETS),
    "decode": ("request_decode_time_seconds",
               "Histogram of time from the first token of a request to its last.", E2E_BUCKETS),
    "inference": ("request_inference_time_seconds",
                  "Histogram of time from the first step of a request to its last token.",
                  E2E_BUCKETS),
    "prompt_len": ("request_prompt_tokens", "Number of prompt tokens per finished request.",
                   TOKEN_BUCKETS),
    "gen_len": ("request_generation_tokens",
                "Number of generated tokens per finished request.", TOKEN_BUCKETS),
}


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
    prompt_tokens: int = 0          # computed (cache hits excluded)
    generation_tokens: int = 0
    num_preemptions: int = 0
    #: Speculative decoding (engine/spec_decode/stats.py); None: speculation is off.
    spec_decode: SpecDecodeFigures | None = None


@dataclass(frozen=True)
class SpecDecodeFigures:
    """The speculator's counters, copied in the engine thread."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()


def _spec_decode_metrics(prefix: str, model: str, spec: SpecDecodeFigures) -> Iterable[Any]:
    for name, doc, value in (
            ("spec_decode_num_drafts", "Number of spec decoding drafts.", spec.num_drafts),
            ("spec_decode_num_draft_tokens", "Number of draft tokens.", spec.num_draft_tokens),
            ("spec_decode_num_accepted_tokens", "Number of accepted tokens.",
             spec.num_accepted_tokens)):
        c = CounterMetricFamily(f"{prefix}:{name}", doc, labels=["model_name"])
        c.add_metric([model], value)
        yield c
    c = CounterMetricFamily(f"{prefix}:spec_decode_num_accepted_tokens_per_pos",
                            "Accepted tokens per draft position.",
                            labels=["model_name", "position"])
    for pos, value in enumerate(spec.accepted_per_pos):
        c.add_metric([model, str(pos)], value)
    yield c


class _SnapshotCollector(Collector):
    """Gauges and counters of the latest snapshot, under both prefixes, at scrape time."""

    def __init__(self, owner: ServerMetrics) -> None:
        self.owner = owner

    def collect(self) -> Iterable[Any]:
        o = self.owner
        snap = o.scrape_snapshot or o.snapshot_source()
        model = [o.model_name]
        hit_rate = (snap.prefix_cache_hits / snap.prefix_cache_queries
                    if snap.prefix_cache_queries else 0.0)
        gauges = (
            ("num_requests_running", "Number of requests in model execution batches.",
             snap.num_running),
            ("num_requests_waiting", "Number of requests waiting to be processed.",
             snap.num_waiting),
            ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
             snap.kv_cache_usage),
            ("num_kv_cache_blocks", "KV cache blocks in total.", snap.num_blocks),
            ("num_free_kv_cache_blocks",
             "KV cache blocks free (cached prefixes included: they are evictable).",
             snap.num_free_blocks),
            ("prefix_cache_hit_rate", "prefix_cache_hits / prefix_cache_queries.", hit_rate),
        )
        counters = (
            ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
             "tokens.", snap.prefix_cache_queries),
            ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             snap.prefix_cache_hits),
            ("prompt_tokens", "Number of prefill tokens processed (prefix-cache hits "
             "included).", o.prompt_tokens),
            ("generation_tokens", "Number of generation tokens processed.",
             snap.generation_tokens),
            ("num_preemptions", "Cumulative number of preemptions from the engine.",
             snap.num_preemptions),
        )
        for prefix in PREFIXES:
            for name, doc, value in gauges:
                g = GaugeMetricFamily(f"{prefix}:{name}", doc, labels=["model_name"])
                g.add_metric(model, value)
                yield g
            for name, doc, value in counters:
                c = CounterMetricFamily(f"{prefix}:{name}", doc, labels=["model_name"])
                c.add_metric(model, value)
                yield c
            c = CounterMetricFamily(f"{prefix}:request_success",
                                    "Count of successfully processed requests.",
                                    labels=["model_name", "finished_reason"])
            for reason in sorted(set(o.finished) | {"stop", "length", "abort"}):
                c.add_metric([o.model_name, reason], o.finished[reason])
            yield c
            if snap.spec_decode is not None:
                yield from _spec_decode_metrics(prefix, o.model_name, snap.spec_decode)
        c = CounterMetricFamily("glowlm:prompt_tokens_computed",
                                "Prompt tokens the model computed (prefix-cache hits "
                                "excluded).", labels=["model_name"])
        c.add_metric(model, snap.prompt_tokens)
        yield c


class ServerMetrics:
    """Everything ``/metrics`` reports; one registry per server (tests run several)."""

    def __init__(self, model_name: str, log_stats: bool = True) -> None:
        self.model_name = model_name
        self.log_stats = log_stats
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            try:
                self.registry.register(collector)
            except ValueError:
                pass  # a collector this platform lacks
        #: The live snapshot (the server sets it to the driver's); render() may pass one.
        self.snapshot_source: Callable[[], EngineSnapshot] = EngineSnapshot
        self.scrape_snapshot: EngineSnapshot | None = None
        self.registry.register(_SnapshotCollector(self))
        self.histograms: dict[str, list[Any]] = {
            kind: [Histogram(f"{prefix}:{name}", doc, ["model_name"], registry=self.registry,
                             buckets=buckets).labels(model_name)
                   for prefix in PREFIXES]
            for kind, (name, doc, buckets) in HISTOGRAMS.items()}
        self.finished: Counter[str] = Counter()
        #: Every prompt token (cache hits included), counted when its request starts.
        self.prompt_tokens = 0
        #: Recent end-to-end latencies, for the Retry-After hint of a full queue.
        self.recent_e2e: deque[float] = deque(maxlen=64)
        self._last_log = time.monotonic()
        self._last_tokens = (0, 0)  # prompt, generation at the last log line
        self._last_spec = SpecDecodeFigures()

    def observe(self, samples: dict[str, list[float]]) -> None:
        """Per-request samples from one engine step (seconds, or token counts)."""
        for kind, values in samples.items():
            if kind == "prompt_tokens":
                self.prompt_tokens += int(sum(values))
                continue
            hists = self.histograms.get(kind)
            if hists and values:
                for v in values:
                    for h in hists:
                        h.observe(v)
        self.recent_e2e.extend(samples.get("e2e", ()))
        if self.log_stats:
            self.maybe_log()

    def count_finished(self, reason: str) -> None:
        self.finished[reason] += 1

    def maybe_log(self, now: float | None = None) -> str | None:
        """vLLM's periodic line, at most every LOG_INTERVAL seconds while there is work."""
        now = time.monotonic() if now is None else now
        elapsed = now - self._last_log
        if elapsed < LOG_INTERVAL:
            return None
        snap = self.snapshot_source()
        prompt, gen = self.prompt_tokens, snap.generation_tokens
        last_prompt, last_gen = self._last_tokens
        self._last_log, self._last_tokens = now, (prompt, gen)
        if prompt == last_prompt and gen == last_gen and not snap.num_unfinished:
            return None  # idle: say nothing, as vLLM
        hit = (snap.prefix_cache_hits / snap.prefix_cache_queries * 100
               if snap.prefix_cache_queries else 0.0)
        line = (f"Avg prompt throughput: {(prompt - last_prompt) / elapsed:.1f} tokens/s, "
                f"Avg generation throughput: {(gen - last_gen) / elapsed:.1f} tokens/s, "
                f"Running: {snap.num_running} reqs, Waiting: {snap.num_waiting} reqs, "
                f"KV cache usage: {snap.kv_cache_usage * 100:.1f}%, "
                f"Prefix cache hit rate: {hit:.1f}%")
        logger.info(line)
        if snap.spec_decode is not None:
            self._log_spec_decode(snap.spec_decode, elapsed)
        return line

    def _log_spec_decode(self, spec: SpecDecodeFigures, elapsed: float) -> None:
        """vLLM's "SpecDecoding metrics" line, over the interval since the last one."""
        last, self._last_spec = self._last_spec, spec
        drafts = spec.num_drafts - last.num_drafts
        if not drafts:
            return
        drafted = spec.num_draft_tokens - last.num_draft_tokens
        accepted = spec.num_accepted_tokens - last.num_accepted_tokens
        per_pos = [(v - (last.accepted_per_pos[i] if i < len(last.accepted_per_pos) else 0))
                   / drafts for i, v in enumerate(spec.accepted_per_pos)]
        logger.info("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: "
                    "%.2f tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d tokens, "
                    "Drafted: %d tokens, Per-position acceptance rate: %s, Avg Draft "
                    "acceptance rate: %.1f%%", 1 + accepted / drafts, accepted / elapsed,
                    drafted / elapsed, accepted, drafted,
                    ", ".join(f"{r:.3f}" for r in per_pos),
                    100 * accepted / drafted if drafted else 0.0)

    def render(self, snap: EngineSnapshot | None = None) -> str:
        self.scrape_snapshot = snap
        try:
            return generate_latest(self.registry).decode()
        finally:
            self.scrape_snapshot = None
