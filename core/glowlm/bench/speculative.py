"""``glowlm bench latency|throughput --speculative-config``: speculation off and on.

One engine, built with the speculative config, runs each case with its speculator
detached and attached, alternating (off, on, off, on, ...), so both see the same
machine minute by minute; the medians are compared. Reported beside the plain
figures: decode tokens/s with speculation and the ratio, tokens emitted per decode
step of a sequence (1 without speculation), the mean acceptance length and rate of
the verification rounds, and whether every greedy run's tokens equal the plain run's.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from glowlm.bench import protocol


def _prompt(engine: Any, args: argparse.Namespace) -> list[int] | None:
    path = getattr(args, "prompt_file", None)
    if path is None:
        return None
    text = path.read_text()
    if args.chat:
        from glowlm.entrypoints.llm import chat_prompt

        return chat_prompt(engine.tokenizer, [{"role": "user", "content": text}])[
            "prompt_token_ids"
        ]
    return engine.tokenize(text)


def compare(engine: Any, args: argparse.Namespace) -> dict[str, Any]:
    speculator = engine.scheduler.speculator
    prompt = _prompt(engine, args)
    plain: list[dict[str, Any]] = []
    spec: list[dict[str, Any]] = []
    stats_before = (
        speculator.stats.num_drafts,
        speculator.stats.num_draft_tokens,
        speculator.stats.num_accepted_tokens,
    )
    rounds = args.num_iters if args.kind == "latency" else 1
    for i in range(rounds + 1):  # round 0 warms both up
        for on, into in ((False, plain), (True, spec)):
            engine.scheduler.speculator = speculator if on else None
            # suffix: the rounds repeat one prompt; earlier rounds' outputs would be found
            # in its cross-request cache, which a new prompt does not have.
            clear = getattr(speculator.proposer, "clear", None)
            if clear is not None:
                clear()
            if args.kind == "latency":
                lat = protocol.measure_latency(
                    engine,
                    args.input_len,
                    args.output_len,
                    args.batch_size,
                    iters=1,
                    warmup=0,
                    prompt=prompt,
                )
                run = dict(lat.runs[0])
                run["per_step"] = (run["output_tokens"] - 1) / max(1, run["decode_steps"])
            else:
                steps = engine.stats.steps
                thr = protocol.measure_throughput(
                    engine,
                    args.input_len,
                    args.output_len,
                    args.num_prompts,
                    args.shared_prefix_len,
                )
                tokens = args.num_prompts * args.output_len
                run = {
                    "decode_tokens_per_s": thr.output_tokens_per_s,
                    "output_tokens": tokens,
                    "per_step": tokens / args.num_prompts / max(1, engine.stats.steps - steps),
                }
            if i:
                into.append(run)
    engine.scheduler.speculator = speculator
    st = speculator.stats
    drafts = st.num_drafts - stats_before[0]
    drafted = st.num_draft_tokens - stats_before[1]
    accepted = st.num_accepted_tokens - stats_before[2]
    off = statistics.median(r["decode_tokens_per_s"] for r in plain)
    on = statistics.median(r["decode_tokens_per_s"] for r in spec)
    out: dict[str, Any] = {
        "speculative_config": args.speculative_config,
        "prompt_tokens": len(prompt) if prompt is not None else args.input_len,
        "output_tokens": spec[-1]["output_tokens"],
        "plain_decode_tokens_per_s": round(off, 3),
        "decode_tokens_per_s": round(on, 3),
        "speculative_speedup": round(on / off, 3) if off else None,
        "plain_tokens_per_step": round(statistics.median(r["per_step"] for r in plain), 3),
        "tokens_per_step": round(statistics.median(r["per_step"] for r in spec), 3),
        "mean_acceptance_length": round(1 + accepted / drafts, 3) if drafts else 0.0,
        "acceptance_rate": round(accepted / drafted, 3) if drafted else 0.0,
        "drafts": drafts,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
    }
    if args.kind == "latency":
        out["identical_to_plain"] = all(
            a["token_ids"] == b["token_ids"] for a, b in zip(plain, spec, strict=True)
        )
        out["ttft_ms"] = round(statistics.median(r["ttft_ms"] for r in spec), 1)
    return out
