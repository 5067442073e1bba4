"""llama.cpp (through llama-cpp-python) on a GGUF of the same model, same protocol.

A second peer beside :mod:`glowlm.bench.hf_peer`: transformers shows what eager
PyTorch does with the same weights, llama.cpp what a hand-written CPU engine does.
The figures follow the shared protocol of :mod:`glowlm.bench.protocol` exactly: the
same prompt ids (token ids go straight in, so the GGUF's tokenizer plays no part),
exactly ``output_len`` greedy tokens whatever the model emits (EOS is not looked at),
TTFT = prefill plus the first token, decode = the ``output_len - 1`` tokens after it,
one warm-up then the median. Greedy picks are an argmax over llama.cpp's logits, as
glowlm's sampler does at temperature 0.

llama-cpp-python is optional and compiled from source for the machine
(``make peers``, docs/peers.md); it is imported only when a measurement runs.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from glowlm.bench.protocol import random_prompts

_MISSING = ("llama-cpp-python is not installed: `make peers` builds it into .venv-peers "
            "(see docs/peers.md)")


def import_llama_cpp() -> Any:
    """The ``llama_cpp`` module, or an ImportError that says how to get it."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise ImportError(_MISSING) from exc
    return llama_cpp


def _check(gguf_path: str | Path, threads: int, **positive: int) -> Path:
    """Fail on bad arguments before the (slow) model load, and without llama_cpp."""
    for name, value in {"threads": threads, **positive}.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    path = Path(gguf_path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    return path


def _load(path: Path, n_ctx: int, threads: int) -> Any:
    """A ``Llama`` with one small context; prefill runs in one decode call per 512 ids."""
    llama_cpp = import_llama_cpp()
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512,
                           n_threads=threads, n_threads_batch=threads, logits_all=False,
                           verbose=False)


def _check_vocab(llm: Any, vocab: int) -> None:
    if llm.n_vocab() < vocab:
        raise ValueError(f"the GGUF has {llm.n_vocab()} tokens, fewer than vocab={vocab}")


def _argmax(llama_cpp: Any, ctx: Any, index: int, n_vocab: int) -> int:
    import numpy as np

    row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(n_vocab,))
    return int(row.argmax())


def _one_latency_run(llama_cpp: Any, llm: Any, prompt: list[int], output_len: int
                     ) -> tuple[float, float]:
    """(TTFT ms, decode tokens/s) of one run, the KV cache emptied first."""
    n_vocab = llm.n_vocab()
    llm.reset()  # n_tokens = 0: the next eval drops every cached position from 0 on
    start = time.perf_counter()
    llm.eval(prompt)
    token = _argmax(llama_cpp, llm.ctx, -1, n_vocab)
    first = time.perf_counter()
    for _ in range(output_len - 1):
        llm.eval([token])
        token = _argmax(llama_cpp, llm.ctx, -1, n_vocab)
    end = time.perf_counter()
    decode = (output_len - 1) / (end - first) if output_len > 1 else 0.0
    return (first - start) * 1e3, decode


def llamacpp_latency(gguf_path: str | Path, input_len: int, output_len: int, vocab: int,
                     threads: int, iters: int = 3) -> dict[str, float]:
    """P1: one prompt (seed 0), ``output_len`` greedy tokens; one warm-up, median of ``iters``.

    The warm-up also pages in the memory-mapped weights, which would otherwise be
    counted in the first TTFT.
    """
    path = _check(gguf_path, threads, input_len=input_len, output_len=output_len,
                  vocab=vocab, iters=iters)
    llama_cpp = import_llama_cpp()
    prompt = random_prompts(1, input_len, vocab, seed=0)[0]
    llm = _load(path, input_len + output_len, threads)
    try:
        _check_vocab(llm, vocab)
        runs = [_one_latency_run(llama_cpp, llm, prompt, output_len) for _ in range(iters + 1)]
    finally:
        llm.close()
    runs = runs[1:]
    return {"ttft_ms": statistics.median(r[0] for r in runs),
            "decode_tokens_per_s": statistics.median(r[1] for r in runs)}


def _batch_context(llama_cpp: Any, llm: Any, n_seq: int, n_ctx_seq: int, n_batch: int,
                   threads: int) -> Any:
    """A second context on the loaded model with one KV sequence per prompt.

    ``Llama`` builds its context for a single sequence and has no argument for more,
    so P2 makes its own through the C API, otherwise set like P1's (same flash-attention
    choice, same KV cache types).
    """
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_seq * n_ctx_seq          # not unified: each sequence gets n_ctx / n_seq
    params.n_batch = n_batch
    params.n_ubatch = 512
    params.n_seq_max = n_seq
    params.n_threads = params.n_threads_batch = threads
    params.flash_attn_type = llm.context_params.flash_attn_type
    params.type_k, params.type_v = llm.context_params.type_k, llm.context_params.type_v
    ctx = llama_cpp.llama_init_from_model(llm.model, params)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not create a context for {n_seq} sequences")
    return ctx


def _decode(llama_cpp: Any, ctx: Any, batch: Any, n_tokens: int) -> None:
    batch.n_tokens = n_tokens
    rc = llama_cpp.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}")


def _batched_generate(llama_cpp: Any, ctx: Any, batch: Any, n_batch: int,
                      prompts: list[list[int]], output_len: int, n_vocab: int
                      ) -> list[list[int]]:
    """Prefill every prompt (packed into batches of ``n_batch`` ids), then decode all
    sequences together one token per step, as transformers' padded batch does.

    Returns each sequence's greedy tokens, so a check can hold them against P1's.
    """
    import numpy as np

    last = [0] * len(prompts)
    n, outputs = 0, []                            # ids in the batch; (batch index, seq)
    for seq, prompt in enumerate(prompts):
        for pos, token in enumerate(prompt):
            if n == n_batch:
                _decode(llama_cpp, ctx, batch, n)
                for index, s in outputs:
                    last[s] = _argmax(llama_cpp, ctx, index, n_vocab)
                n, outputs = 0, []
            is_last = pos == len(prompt) - 1
            batch.token[n], batch.pos[n] = token, pos
            batch.n_seq_id[n], batch.seq_id[n][0], batch.logits[n] = 1, seq, int(is_last)
            if is_last:
                outputs.append((n, seq))
            n += 1
    _decode(llama_cpp, ctx, batch, n)
    for index, s in outputs:
        last[s] = _argmax(llama_cpp, ctx, index, n_vocab)
    generated = [[token] for token in last]
    pos = len(prompts[0])
    for step in range(output_len - 1):
        for seq, token in enumerate(last):
            batch.token[seq], batch.pos[seq] = token, pos + step
            batch.n_seq_id[seq], batch.seq_id[seq][0], batch.logits[seq] = 1, seq, 1
        _decode(llama_cpp, ctx, batch, len(prompts))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx),
                                       shape=(len(prompts), n_vocab))
        last = logits.argmax(axis=1).tolist()
        for tokens, token in zip(generated, last, strict=True):
            tokens.append(token)
    return generated


def llamacpp_throughput(gguf_path: str | Path, input_len: int, output_len: int,
                        num_prompts: int, vocab: int, threads: int) -> dict[str, float]:
    """P2: ``num_prompts`` prompts (seed 1) at once, ``output_len`` greedy tokens each.

    One untimed warm-up pass of a single prompt pages the weights in first; the timed
    pass is one prefill of all prompts then one batched decode step per token.
    """
    path = _check(gguf_path, threads, input_len=input_len, output_len=output_len,
                  num_prompts=num_prompts, vocab=vocab)
    llama_cpp = import_llama_cpp()
    if num_prompts > llama_cpp.llama_max_parallel_sequences():
        raise ValueError(f"llama.cpp takes at most {llama_cpp.llama_max_parallel_sequences()} "
                         f"sequences per context, not {num_prompts}")
    prompts = random_prompts(num_prompts, input_len, vocab, seed=1)
    n_batch = max(512, num_prompts)
    llm = _load(path, input_len + output_len, threads)
    ctx = batch = None
    try:
        _check_vocab(llm, vocab)
        n_vocab = llm.n_vocab()
        _one_latency_run(llama_cpp, llm, prompts[0], 2)               # warm-up
        ctx = _batch_context(llama_cpp, llm, num_prompts, input_len + output_len, n_batch,
                             threads)
        batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        start = time.perf_counter()
        _batched_generate(llama_cpp, ctx, batch, n_batch, prompts, output_len, n_vocab)
        elapsed = time.perf_counter() - start
    finally:
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
        if ctx is not None:
            llama_cpp.llama_free(ctx)
        llm.close()
    out = num_prompts * output_len
    return {"elapsed_s": elapsed, "output_tokens_per_s": out / elapsed,
            "total_tokens_per_s": (out + num_prompts * input_len) / elapsed}
