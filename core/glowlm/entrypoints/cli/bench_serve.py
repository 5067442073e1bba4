"""``glowlm bench serve``: load an OpenAI-compatible server and report throughput and latency.

Prompts are token ids drawn uniformly from ``[3, vocab)`` (ids 0-2 are usually
special), sent as streaming completions with ``ignore_eos`` so every request
produces exactly ``--random-output-len`` tokens. Timing uses httpx directly,
not the openai client, so nothing but the network sits between the server's
chunks and the clock. TTFT is request start to the first chunk carrying a
token; ITL is the gap between token-carrying chunks; TPOT is
``(latency - TTFT) / (output tokens - 1)`` per request. Output token counts
come from the server's usage, not from counting chunks.

Arrivals: ``--request-rate inf`` sends everything at once; otherwise a Poisson
process at that rate (seeded). ``--max-concurrency`` caps requests in flight.
The JSON result uses vLLM's ``bench serve`` keys so existing report scripts
read it.
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
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000",
                   help="server root (default http://127.0.0.1:8000)")
    p.add_argument("--endpoint", default="/v1/completions")
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
    p.add_argument("--disable-tqdm", action="store_true", help="accepted for vLLM parity")


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
        in_lens = _lengths(args.random_input_len, args.random_range_ratio, args.num_prompts, rng)
        out_lens = _lengths(args.random_output_len, args.random_range_ratio, args.num_prompts,
                            rng)
        prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in in_lens]

        def payload(i: int) -> dict[str, Any]:
            return {"model": model, "prompt": prompts[i], "max_tokens": out_lens[i],
                    "temperature": 0.0, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}

        url = base + args.endpoint
        probe = RequestResult(len(prompts[0]))
        await _one(client, url, {**payload(0), "max_tokens": 2}, probe)
        if not probe.ok:
            raise ConfigError(f"the test request failed: {probe.error}")
        results = [RequestResult(n) for n in in_lens]
        sem = asyncio.Semaphore(limit)

        async def limited(i: int) -> None:
            async with sem:
                await _one(client, url, payload(i), results[i])

        tasks = []
        start = time.perf_counter()
        for i in range(args.num_prompts):
            tasks.append(asyncio.create_task(limited(i)))
            if args.request_rate != float("inf") and i + 1 < args.num_prompts:
                await asyncio.sleep(rng.expovariate(args.request_rate))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return summarize(args, model, results, duration)


def _stats(name: str, values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s] or [0.0]
    return {f"mean_{name}_ms": statistics.fmean(ms), f"median_{name}_ms": statistics.median(ms),
            f"std_{name}_ms": statistics.pstdev(ms), f"p99_{name}_ms": percentile(ms, 99)}


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
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    out: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "glowlm",
        "model_id": model, "base_url": args.base_url, "num_prompts": args.num_prompts,
        "request_rate": args.request_rate if args.request_rate != float("inf") else "inf",
        "max_concurrency": args.max_concurrency, "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len, "seed": args.seed,
        "duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration, "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    out.update(_stats("ttft", [r.ttft for r in ok]))
    out.update(_stats("tpot", tpots))
    out.update(_stats("itl", [x for r in ok for x in r.itl]))
    out.update(_stats("e2el", [r.latency for r in ok]))
    out.update({"input_lens": [r.prompt_len for r in results],
                "output_lens": [r.output_tokens for r in results],
                "ttfts": [r.ttft for r in results], "itls": [r.itl for r in results],
                "errors": [r.error for r in results]})
    for item in args.metadata:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--metadata {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


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
        lines.append("{s:{c}^60}".format(s=f" {title} ", c="-"))
        for stat in ("mean", "median", "p99"):
            label = f"{stat.capitalize() if stat != 'p99' else 'P99'} {key.upper()} (ms):"
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
    result = asyncio.run(benchmark(args))
    print(report(result))
    if args.save_result is not None:
        if args.save_result:  # --save-result FILE
            path = Path(args.save_result)
        else:  # bare --save-result: vLLM's --result-dir / --result-filename
            path = Path(args.result_dir) / (args.result_filename or (
                f"glowlm-{args.request_rate}qps-{result['model_id'].replace('/', '_')}-"
                f"{result['date']}.json"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
        print(f"result saved to {path}")
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
