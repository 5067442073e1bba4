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
import sys
import time
from pathlib import Path
from typing import Any

from glowlm.bench.serve_datasets import Prompt, build_prompts
from glowlm.bench.serve_results import RequestResult, parse_percentiles, plot, report, summarize
from glowlm.errors import ConfigError


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
    return summarize(args, model, results, duration, endpoint(args))


def endpoint(args: argparse.Namespace) -> str:
    given = args.endpoint or ("/v1/chat/completions" if args.backend == "openai-chat"
                              else "/v1/completions")
    return {"completions": "/v1/completions", "chat": "/v1/chat/completions"}.get(given, given)


def _progress(args: argparse.Namespace, total: int) -> Any:
    if args.disable_tqdm:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req", file=sys.stderr)


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
