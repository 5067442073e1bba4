"""``glowlm bench serve``: load an OpenAI-compatible server and report throughput and latency.

Datasets (``--dataset-name``, vLLM's): ``random`` prompts are token ids drawn
uniformly from ``[3, vocab)`` (ids 0-2 are usually special); ``sharegpt`` takes
each conversation's first human turn from a local JSON file in ShareGPT's
public format (``--dataset-path``), with the first reply's token count as the
output length (``--sharegpt-output-len`` overrides); ``prefix-repetition``
builds ``--prefix-repetition-num-prefixes`` shared prefixes, each followed by
random suffixes (the prefix cache's case). ``--endpoint`` is
``/v1/completions`` (token-id prompts) or ``/v1/chat/completions`` (prompts as
text, through the server's ``/detokenize``). Requests stream with
``ignore_eos`` so every request produces exactly its output length. Timing uses httpx directly,
not the openai client, so nothing but the network sits between the server's
chunks and the clock. TTFT is request start to the first chunk carrying a
token; ITL is the gap between token-carrying chunks; TPOT is
``(latency - TTFT) / (output tokens - 1)`` per request. Output token counts
come from the server's usage, not from counting chunks.

Arrivals: ``--request-rate inf`` sends everything at once; otherwise a Poisson
process at that rate (seeded). ``--max-concurrency`` caps requests in flight;
``--num-warmups`` requests run first and are not counted. The JSON result uses
vLLM's ``bench serve`` keys so existing report scripts read it;
``--percentile-metrics`` / ``--metric-percentiles`` choose the reported
percentiles as vLLM's flags do. ``--plot`` writes PNGs beside the result:
latency CDFs (TTFT, TPOT, ITL, E2E) and output throughput over time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000",
                   help="server root (default http://127.0.0.1:8000)")
    p.add_argument("--backend", default="openai", choices=("openai", "openai-chat", "vllm"),
                   help="vLLM's names; openai-chat defaults --endpoint to /v1/chat/completions")
    p.add_argument("--endpoint", help="/v1/completions (default) or /v1/chat/completions")
    p.add_argument("--dataset-name", default="random",
                   choices=("random", "sharegpt", "prefix-repetition"))
    p.add_argument("--dataset-path", help="ShareGPT JSON file (list of {conversations: "
                   "[{from, value}...]})")
    p.add_argument("--sharegpt-output-len", type=int,
                   help="output length for every ShareGPT request (default: the reply's)")
    p.add_argument("--prefix-repetition-prefix-len", type=int, default=256)
    p.add_argument("--prefix-repetition-suffix-len", type=int, default=256)
    p.add_argument("--prefix-repetition-num-prefixes", type=int, default=10)
    p.add_argument("--prefix-repetition-output-len", type=int, default=128)
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                   help="comma list of ttft,tpot,itl,e2el to report percentiles of "
                        "(default ttft,tpot,itl, as vLLM)")
    p.add_argument("--metric-percentiles", default="99",
                   help="comma list of percentiles, e.g. 25,50,75,99 (default 99)")
    p.add_argument("--num-warmups", type=int, default=0,
                   help="requests sent first and not counted (default 0)")
    p.add_argument("--plot", action="store_true",
                   help="write PNG plots (latency CDFs, throughput over time) beside the "
                        "result (needs matplotlib)")
    p.add_argument("--plot-dir", help="directory for the plots (default: --result-dir)")
    p.add_argument("--model", help="model name (default: the server's first model)")
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second, Poisson arrivals (default inf: all at once)")
    p.add_argument("--max-concurrency", type=int, help="requests in flight at most")
    p.add_argument("--random-input-len", type=int, default=128)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform in [L*(1-r), L*(1+r)] (default 0: exact)")
    p.add_argument("--vocab-size", type=int,
                   help="draw ids below this (default: the server's /v1/models vocab_size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true", default=True,
                   help="always on: output lengths are exact")
    p.add_argument("--save-result", nargs="?", const="", default=None, metavar="FILE",
                   help="write the JSON result to FILE (or to --result-dir/--result-filename)")
    p.add_argument("--result-dir", default=".")
    p.add_argument("--result-filename")
    p.add_argument("--metadata", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra fields recorded in the JSON result")
    p.add_argument("--timeout", type=float, default=6 * 3600.0,
                   help="per-request timeout in seconds")
    p.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def register_serve_bench(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add ``serve`` to the ``glowlm bench`` verb's subparsers."""
    p = bench_subparsers.add_parser(
        "serve", help="load a running server and report throughput and latency",
        description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_arguments(p)
    p.set_defaults(func=run)


def _lengths(mean: int, ratio: float, count: int, rng: random.Random) -> list[int]:
    lo, hi = max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(count)]


async def _one(client: Any, url: str, payload: dict[str, Any], result: RequestResult) -> None:
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=payload) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = chunk["error"].get("message", "stream error")
                    return
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices"):
                    continue
                t = time.perf_counter()
                if result.ttft == 0.0:
                    result.ttft = t - start
                else:
                    result.itl.append(t - last)
                result.token_times.append(t)
                last = t
        result.latency = time.perf_counter() - start
        result.ok = result.output_tokens > 0
        if not result.ok:
            result.error = "no usage in the stream"
    except Exception as exc:  # noqa: BLE001 - a failed request is a figure, not a crash
        result.error = f"{type(exc).__name__}: {exc}"


async def _server_info(client: Any, base: str) -> dict[str, Any]:
    resp = await client.get(f"{base}/v1/models")
    if resp.status_code != 200:
        raise ConfigError(f"{base}/v1/models answered HTTP {resp.status_code}: {resp.text[:200]}")
    data = resp.json().get("data") or []
    if not data:
        raise ConfigError(f"{base}/v1/models lists no model")
    return dict(data[0])


@dataclass
class Prompt:
    ids: list[int] | None       # token ids (completions); None for text-only prompts
    text: str | None            # text (chat, ShareGPT)
    prompt_len: int
    output_len: int


def load_sharegpt(path: str, count: int, rng: random.Random) -> list[tuple[str, str]]:
    """(first human turn, first reply) pairs from a ShareGPT-format JSON file, shuffled."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--dataset-path {path}: cannot read it as JSON ({exc})") from None
    pairs = []
    for item in data if isinstance(data, list) else []:
        conv = item.get("conversations") or item.get("conversation") or []
        if len(conv) >= 2 and isinstance(conv[0], dict) and isinstance(conv[1], dict):
            human, reply = conv[0].get("value"), conv[1].get("value")
            if isinstance(human, str) and isinstance(reply, str) and human and reply:
                pairs.append((human, reply))
    if not pairs:
        raise ConfigError(f"--dataset-path {path}: no conversation with two turns (ShareGPT "
                          "format: [{\"conversations\": [{\"from\": \"human\", \"value\": ...}, "
                          "{\"from\": \"gpt\", \"value\": ...}]}])")
    rng.shuffle(pairs)
    return pairs


async def build_prompts(args: argparse.Namespace, client: Any, base: str, vocab: int,
                        rng: random.Random, chat: bool) -> list[Prompt]:
    """The dataset's prompts; text is fetched through the server's /tokenize, /detokenize."""
    n = args.num_prompts + args.num_warmups

    async def tokens(text: str) -> list[int]:
        r = await client.post(f"{base}/tokenize", json={"prompt": text,
                                                         "add_special_tokens": False})
        if r.status_code != 200:
            raise ConfigError(f"{base}/tokenize answered HTTP {r.status_code}: the sharegpt "
                              "dataset needs it to count tokens")
        return list(r.json()["tokens"])

    async def text_of(ids: list[int]) -> str:
        r = await client.post(f"{base}/detokenize", json={"tokens": ids})
        if r.status_code != 200:
            raise ConfigError(f"{base}/detokenize answered HTTP {r.status_code}: chat prompts "
                              "of token ids need it")
        return str(r.json()["prompt"])

    out: list[Prompt] = []
    if args.dataset_name == "sharegpt":
        if not args.dataset_path:
            raise ConfigError("--dataset-name sharegpt needs --dataset-path FILE")
        for human, reply in load_sharegpt(args.dataset_path, n, rng):
            if len(out) == n:
                break
            ids = await tokens(human)
            out_len = args.sharegpt_output_len or len(await tokens(reply))
            if len(ids) < 4 or out_len < 4:  # vLLM's filter: too short to time
                continue
            out.append(Prompt(None, human, len(ids), out_len))
        if len(out) < n:
            raise ConfigError(f"--dataset-path has {len(out)} usable conversations; "
                              f"{n} needed (--num-prompts + --num-warmups)")
        return out
    if args.dataset_name == "prefix-repetition":
        k = max(1, args.prefix_repetition_num_prefixes)
        prefixes = [[rng.randrange(3, vocab) for _ in range(args.prefix_repetition_prefix_len)]
                    for _ in range(k)]
        for i in range(n):
            ids = prefixes[i % k] + [rng.randrange(3, vocab)
                                     for _ in range(args.prefix_repetition_suffix_len)]
            out.append(Prompt(ids, None, len(ids), args.prefix_repetition_output_len))
        rng.shuffle(out)
    else:
        in_lens = _lengths(args.random_input_len, args.random_range_ratio, n, rng)
        out_lens = _lengths(args.random_output_len, args.random_range_ratio, n, rng)
        for a, b in zip(in_lens, out_lens, strict=True):
            out.append(Prompt([rng.randrange(3, vocab) for _ in range(a)], None, a, b))
    if chat:
        for p in out:
            assert p.ids is not None
            p.text = await text_of(p.ids)
    return out


async def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    base = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limit = args.max_concurrency or args.num_prompts
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    async with httpx.AsyncClient(headers=headers, timeout=args.timeout, limits=limits) as client:
        try:
            info = await _server_info(client, base)
        except httpx.HTTPError as exc:
            raise ConfigError(f"cannot reach the server at {base}: {exc}") from None
        model = args.model or info["id"]
        vocab = args.vocab_size or info.get("vocab_size")
        if not vocab or vocab <= 3:
            raise ConfigError("the server did not report vocab_size; pass --vocab-size")
        rng = random.Random(args.seed)
        chat = endpoint(args) == "/v1/chat/completions"
        try:
            prompts = await build_prompts(args, client, base, vocab, rng, chat)
        except httpx.HTTPError as exc:
            raise ConfigError(f"cannot reach the server at {base}: {exc}") from None
        warmups, prompts = prompts[:args.num_warmups], prompts[args.num_warmups:]

        def payload(p: Prompt) -> dict[str, Any]:
            body: dict[str, Any] = {
                "model": model, "max_tokens": p.output_len, "temperature": 0.0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            if chat:
                body["messages"] = [{"role": "user", "content": p.text}]
            else:
                body["prompt"] = p.ids if p.ids is not None else p.text
            return body

        url = base + endpoint(args)
        probe = RequestResult(prompts[0].prompt_len)
        await _one(client, url, {**payload(prompts[0]), "max_tokens": 2}, probe)
        if not probe.ok:
            raise ConfigError(f"the test request failed: {probe.error}")
        for w in warmups:  # one at a time: warm caches and the allocator, not counted
            await _one(client, url, payload(w), RequestResult(w.prompt_len))
        results = [RequestResult(p.prompt_len) for p in prompts]
        sem = asyncio.Semaphore(limit)
        bar = _progress(args, len(prompts))

        async def limited(i: int) -> None:
            async with sem:
                results[i].start = time.perf_counter() - start
                await _one(client, url, payload(prompts[i]), results[i])
                for j, t in enumerate(results[i].token_times):
                    results[i].token_times[j] = t - start
                if bar is not None:
                    bar.update(1)

        tasks = []
        start = time.perf_counter()
        for i in range(len(prompts)):
            tasks.append(asyncio.create_task(limited(i)))
            if args.request_rate != float("inf") and i + 1 < len(prompts):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        if bar is not None:
            bar.close()
    return summarize(args, model, results, duration)


def endpoint(args: argparse.Namespace) -> str:
    given = args.endpoint or ("/v1/chat/completions" if args.backend == "openai-chat"
                              else "/v1/completions")
    return {"completions": "/v1/completions", "chat": "/v1/chat/completions"}.get(given, given)


def _progress(args: argparse.Namespace, total: int) -> Any:
    if args.disable_tqdm:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req", file=sys.stderr)


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
              duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    metrics, qs = parse_percentiles(args)
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    out: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "glowlm",
        "model_id": model, "base_url": args.base_url, "num_prompts": args.num_prompts,
        "request_rate": args.request_rate if args.request_rate != float("inf") else "inf",
        "burstiness": 1.0, "endpoint_type": args.backend, "endpoint": endpoint(args),
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


def run(args: argparse.Namespace) -> int:
    if args.num_prompts < 1 or args.random_input_len < 1 or args.random_output_len < 1:
        raise ConfigError("--num-prompts, --random-input-len and --random-output-len must be >= 1")
    if args.request_rate <= 0:
        raise ConfigError("--request-rate must be > 0 (or inf)")
    if args.num_warmups < 0:
        raise ConfigError("--num-warmups must be >= 0")
    parse_percentiles(args)  # bad values fail before any request
    result = asyncio.run(benchmark(args))
    print(report(result))
    if args.save_result:  # --save-result FILE
        path = Path(args.save_result)
    else:  # bare --save-result: vLLM's --result-dir / --result-filename
        path = Path(args.result_dir) / (args.result_filename or (
            f"glowlm-{args.request_rate}qps-{result['model_id'].replace('/', '_')}-"
            f"{result['date']}.json"))
    if args.save_result is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
        print(f"result saved to {path}")
    if args.plot:
        for png in plot(result, Path(args.plot_dir) if args.plot_dir else path.parent,
                        path.stem):
            print(f"plot saved to {png}")
    return 0 if result["completed"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glowlm bench serve", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    from glowlm.errors import GlowlmError

    try:
        return run(args)
    except GlowlmError as exc:
        print(f"glowlm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
