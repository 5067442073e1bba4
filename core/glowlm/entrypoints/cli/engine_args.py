"""Engine and sampling flags shared by ``serve`` and the offline verbs (generate, bench).

Names and value syntax follow ``vllm serve`` so copied command lines work:
vLLM's dtype names (``half``, ``float``...), human-readable sizes for
``--max-model-len`` (``4k``, ``32K``, ``1m``), ``--enable-prefix-caching`` /
``--no-enable-prefix-caching``, ``--tokenizer`` and ``--trust-remote-code``
(accepted; glowlm runs no code from model directories, so it only warns).
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from glowlm.logger import init_logger
from glowlm.sampling.params import SamplingParams

logger = init_logger(__name__)

#: vLLM's --dtype names -> glowlm's. ``half`` and ``float`` are vLLM's aliases.
DTYPE_ALIASES = {"auto": "auto", "half": "float16", "float16": "float16", "fp16": "float16",
                 "bfloat16": "bfloat16", "bf16": "bfloat16", "float": "float32",
                 "float32": "float32", "fp32": "float32"}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*$")
#: vLLM's rule: lowercase is decimal (1k = 1000), uppercase binary (1K = 1024).
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}


def human_int(text: str) -> int:
    """``4096``, ``4k`` (4000), ``4K`` (4096), ``25.6k``, ``1m``, ``1M``: as vLLM parses them."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: use an integer, optionally with k/m/g (powers of 1000) "
            "or K/M/G (powers of 1024), e.g. 4096, 4k, 32K")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens")
    return int(value)


def dtype_arg(text: str) -> str:
    try:
        return DTYPE_ALIASES[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"invalid dtype {text!r}; choose from {', '.join(DTYPE_ALIASES)}") from None


def add_engine_args(p: argparse.ArgumentParser, online: bool = False) -> None:
    """Engine flags; ``online`` only changes the defaults the help text states."""
    tokens, seqs, where = (2048, 128, "online") if online else (4096, 256, "offline")
    g = p.add_argument_group("engine")
    g.add_argument("--dtype", default="auto", type=dtype_arg, metavar="DTYPE",
                   help="weights/activations dtype: auto (the model's own), bfloat16, "
                        "float16 (half), float32 (float); bfloat16 is recommended on CPUs")
    g.add_argument("--quantization", metavar="METHOD",
                   help="the checkpoint's quantization method (awq, gptq, "
                        "compressed-tensors); optional, read from its config.json; "
                        "a different name is refused, as in vLLM")
    g.add_argument("--tokenizer", metavar="DIR",
                   help="tokenizer directory (default: the model's)")
    g.add_argument("--revision", metavar="REV",
                   help="branch, tag or commit of an ORG/NAME model in the Hugging Face cache "
                        "(default: main)")
    g.add_argument("--gguf-file", metavar="NAME",
                   help="which .gguf file to load when the model directory (or cached "
                        "ORG/NAME) holds several")
    g.add_argument("--trust-remote-code", action="store_true", default=False,
                   help="accepted for vLLM compatibility; glowlm never runs code from a "
                        "model directory (a warning says so)")
    g.add_argument("--platform", help="force a platform by name (overrides GLOWLM_PLATFORM)")
    g.add_argument("--max-model-len", type=human_int, metavar="N",
                   help="context length, e.g. 4096, 4k (4000), 4K (4096) (default: the "
                        "model's)")
    g.add_argument("--block-size", type=int, help="KV cache block size, a multiple of the "
                   "platform's block_size_multiple (32 on every in-tree platform; default 128)")
    g.add_argument("--max-num-batched-tokens", type=human_int,
                   help=f"tokens per engine step (default {tokens} x world size {where})")
    g.add_argument("--max-num-seqs", type=int,
                   help=f"sequences per batch (default {seqs} x world size {where})")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=None, help="the prefix cache (default: on)")
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
    par.add_argument("-n", "--nnodes", type=int, metavar="N",
                     help="hosts the TP x PP ranks are spread over, one command per host "
                          "(default 1)")
    par.add_argument("-r", "--node-rank", type=int, metavar="R",
                     help="this host's index, 0..N-1; host 0 runs the driver (this command), "
                          "the others 'glowlm serve ... --headless' (default 0)")
    par.add_argument("--master-addr", metavar="ADDR",
                     help="host 0's address, where the other hosts connect (default "
                          "MASTER_ADDR, else 127.0.0.1)")
    par.add_argument("--master-port", type=int, metavar="PORT",
                     help="host 0's port for the other hosts; gloo uses PORT + 1 "
                          "(default MASTER_PORT, else 29501)")
    if online:
        par.add_argument("-dp", "--data-parallel-size", type=int, metavar="N",
                         help="engine replicas (processes) behind this server, each with its "
                              "own TP x PP ranks; requests go to the least loaded (default 1)")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    if getattr(args, "trust_remote_code", False):
        logger.warning("--trust-remote-code: accepted, but glowlm runs no code from model "
                       "directories; only built-in architectures load")
    keys = ("tokenizer", "revision", "gguf_file", "dtype", "quantization", "platform",
            "max_model_len",
            "block_size", "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
            "allow_pickle", "seed")
    keys = (*keys, "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
            "nnodes", "node_rank", "master_addr", "master_port")
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
