"""Engine and sampling flags shared by the offline verbs (generate, bench)."""

from __future__ import annotations

import argparse
from typing import Any

from glowlm.sampling.params import SamplingParams


def add_engine_args(p: argparse.ArgumentParser, online: bool = False) -> None:
    """Engine flags; ``online`` only changes the defaults the help text states."""
    tokens, seqs, where = (2048, 128, "online") if online else (4096, 256, "offline")
    g = p.add_argument_group("engine")
    g.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"),
                   help="weights/activations dtype (default: the model's own; bfloat16 is "
                        "recommended on CPUs)")
    g.add_argument("--platform", help="force a platform by name (overrides GLOWLM_PLATFORM)")
    g.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    g.add_argument("--block-size", type=int, help="KV cache block size, a multiple of the "
                   "platform's block_size_multiple (32 on every in-tree platform; default 128)")
    g.add_argument("--max-num-batched-tokens", type=int,
                   help=f"tokens per engine step (default {tokens} x world size {where})")
    g.add_argument("--max-num-seqs", type=int,
                   help=f"sequences per batch (default {seqs} x world size {where})")
    g.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching",
                   action="store_false", default=None, help="turn the prefix cache off")
    g.add_argument("--allow-pickle", action="store_true", default=None,
                   help="allow *.bin pickle weights (they run code when loaded)")
    g.add_argument("--seed", type=int, help="engine seed for unseeded requests (default 0)")
    par = p.add_argument_group("parallelism (vLLM's names; docs/parallelism.md)")
    par.add_argument("-tp", "--tensor-parallel-size", type=int, metavar="N",
                     help="tensor-parallel ranks, one process each (auto binding: one NUMA "
                          "node per rank; recommended: the number of NUMA nodes; default 1)")
    par.add_argument("-pp", "--pipeline-parallel-size", type=int, metavar="N",
                     help="pipeline stages, the model's layers split between them; combines "
                          "with -tp (TP x PP ranks; default 1)")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("dtype", "platform", "max_model_len", "block_size", "max_num_batched_tokens",
            "max_num_seqs", "enable_prefix_caching", "allow_pickle", "seed")
    keys = (*keys, "tensor_parallel_size", "pipeline_parallel_size")
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (names as in the OpenAI and vLLM APIs)")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--n", type=int, default=1, help="completions per prompt")
    g.add_argument("--sampling-seed", type=int, dest="sampling_seed",
                   help="per-request seed: same seed, same text")
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--stop-token-ids", type=int, nargs="+")
    g.add_argument("--min-tokens", type=int, default=0)
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--logprobs", type=int)
    g.add_argument("--presence-penalty", type=float, default=0.0)
    g.add_argument("--frequency-penalty", type=float, default=0.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        min_p=args.min_p, seed=args.sampling_seed, max_tokens=args.max_tokens,
        min_tokens=args.min_tokens, stop=args.stop, stop_token_ids=args.stop_token_ids,
        ignore_eos=args.ignore_eos, logprobs=args.logprobs,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty)
