"""The results of ``glowlm bench serve``: per-request timings, vLLM's result JSON, the
printed report and the plots.

TTFT is request start to the first chunk carrying a token; ITL the gap between
token-carrying chunks; TPOT ``(latency - TTFT) / (output tokens - 1)`` per request.
Percentiles interpolate between closest ranks, as ``numpy.percentile`` does.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from glowlm.errors import ConfigError


@dataclass
class RequestResult:
    prompt_len: int
    ok: bool = False
    start: float = 0.0             # seconds since the benchmark started
    token_times: list[float] = field(default_factory=list)  # token-carrying chunks, same clock
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


METRICS = ("ttft", "tpot", "itl", "e2el")


def _stats(name: str, values_s: list[float], percentiles: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s] or [0.0]
    out = {f"mean_{name}_ms": statistics.fmean(ms), f"median_{name}_ms": statistics.median(ms),
           f"std_{name}_ms": statistics.pstdev(ms)}
    for q in percentiles:
        out[f"p{q:g}_{name}_ms"] = percentile(ms, q)
    return out


def parse_percentiles(args: argparse.Namespace) -> tuple[list[str], list[float]]:
    metrics = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    bad = [m for m in metrics if m not in METRICS]
    if bad:
        raise ConfigError(f"--percentile-metrics: unknown {', '.join(bad)}; choose from "
                          f"{', '.join(METRICS)}")
    try:
        qs = [float(q) for q in args.metric_percentiles.split(",") if q.strip()]
    except ValueError:
        raise ConfigError("--metric-percentiles: a comma list of numbers, e.g. 50,90,99") \
            from None
    if any(not 0 < q <= 100 for q in qs):
        raise ConfigError("--metric-percentiles must be in (0, 100]")
    return metrics, qs


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks, as numpy.percentile does."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(args: argparse.Namespace, model: str, results: list[RequestResult],
              duration: float, endpoint: str) -> dict[str, Any]:
    """vLLM's ``bench serve`` result: the run's settings, totals, throughputs, the
    chosen percentiles of each metric, and the per-request series."""
    ok = [r for r in results if r.ok]
    metrics, qs = parse_percentiles(args)
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    out: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "glowlm",
        "model_id": model, "base_url": args.base_url, "num_prompts": args.num_prompts,
        "request_rate": args.request_rate if args.request_rate != float("inf") else "inf",
        "burstiness": 1.0, "endpoint_type": args.backend, "endpoint": endpoint,
        "dataset_name": args.dataset_name,
        "max_concurrency": args.max_concurrency, "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len, "seed": args.seed,
        "duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration, "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    values = {"ttft": [r.ttft for r in ok], "tpot": tpots,
              "itl": [x for r in ok for x in r.itl], "e2el": [r.latency for r in ok]}
    for name in metrics:
        out.update(_stats(name, values[name], qs))
    out["percentile_metrics"], out["metric_percentiles"] = metrics, qs
    per_second = _tokens_per_second([t for r in ok for t in r.token_times])
    out["max_output_tokens_per_s"] = max(per_second, default=0)
    out["output_tokens_per_second_timeline"] = per_second
    out.update({"input_lens": [r.prompt_len for r in results],
                "output_lens": [r.output_tokens for r in results],
                "ttfts": [r.ttft for r in results], "itls": [r.itl for r in results],
                "e2els": [r.latency for r in results],
                "tpots": [(r.latency - r.ttft) / (r.output_tokens - 1)
                          if r.ok and r.output_tokens > 1 else None for r in results],
                "start_times": [r.start for r in results],
                "errors": [r.error for r in results]})
    for item in args.metadata:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--metadata {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _tokens_per_second(times: list[float]) -> list[int]:
    """Tokens received in each whole second of the run (chunks carry one token each)."""
    if not times:
        return []
    counts = [0] * (int(max(times)) + 1)
    for t in times:
        counts[int(max(t, 0.0))] += 1
    return counts


def plot(result: dict[str, Any], out_dir: Path, stem: str) -> list[Path]:
    """Latency CDFs and output throughput over time as PNGs; returns the files written."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ConfigError("--plot needs matplotlib (pip install matplotlib, or the dev "
                          "extra)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    ok = [i for i, e in enumerate(result["errors"]) if not e]
    series = {"TTFT": [result["ttfts"][i] * 1000 for i in ok],
              "ITL": [x * 1000 for i in ok for x in result["itls"][i]],
              "E2E latency": [result["e2els"][i] * 1000 for i in ok]}
    tpot = [result["tpots"][i] * 1000 for i in ok if result["tpots"][i] is not None]
    if tpot:
        series["TPOT"] = tpot
    fig, axes = plt.subplots(1, len(series), figsize=(4 * len(series), 3.2))
    for ax, (name, vals) in zip(axes, series.items(), strict=True):
        vals = sorted(vals)
        ax.plot(vals, [(i + 1) / len(vals) for i in range(len(vals))] if vals else [])
        ax.set_title(f"{name} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of samples")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    cdf = out_dir / f"{stem}-latency-cdf.png"
    fig.savefig(cdf, dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    timeline = result["output_tokens_per_second_timeline"]
    ax.plot(range(len(timeline)), timeline, drawstyle="steps-post")
    ax.set_title("Output throughput over time")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("tokens/s")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    tput = out_dir / f"{stem}-throughput.png"
    fig.savefig(tput, dpi=100)
    plt.close(fig)
    return [cdf, tput]


def report(result: dict[str, Any]) -> str:
    rows = [("Successful requests:", result["completed"]),
            ("Failed requests:", result["failed"]),
            ("Maximum request concurrency:", result["max_concurrency"]),
            ("Benchmark duration (s):", f"{result['duration']:.2f}"),
            ("Total input tokens:", result["total_input_tokens"]),
            ("Total generated tokens:", result["total_output_tokens"]),
            ("Request throughput (req/s):", f"{result['request_throughput']:.2f}"),
            ("Output token throughput (tok/s):", f"{result['output_throughput']:.2f}"),
            ("Total token throughput (tok/s):", f"{result['total_token_throughput']:.2f}")]
    titles = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
              "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}
    lines = ["{s:{c}^60}".format(s=" Serving Benchmark Result ", c="=")]
    lines += [f"{k:<42}{v!s:>18}" for k, v in rows]
    for key, title in titles.items():
        if key not in result.get("percentile_metrics", METRICS):
            continue
        lines.append("{s:{c}^60}".format(s=f" {title} ", c="-"))
        stats = ["mean", "median"] + [f"p{q:g}" for q in result.get("metric_percentiles", [99])]
        for stat in stats:
            name = stat.capitalize() if not stat.startswith("p") else stat.upper()
            label = f"{name} {key.upper()} (ms):"
            lines.append(f"{label:<42}{result[f'{stat}_{key}_ms']:>18.2f}")
    lines.append("=" * 60)
    if result["failed"]:
        first = next(e for e in result["errors"] if e)
        lines.append(f"first error: {first}")
    return "\n".join(lines)
