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

from glowlm.config import KV_CACHE_DTYPE_NAMES
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
                   help="branch, tag or commit of an ORG/NAME model on the Hugging Face Hub "
                        "(default: main); downloaded into the HF cache when missing")
    g.add_argument("--hf-overrides", type=_json_object, metavar="JSON",
                   help="config fields set over the checkpoint's, as vLLM: e.g. a "
                        "Qwen3-Reranker as '{\"architectures\": "
                        "[\"Qwen3ForSequenceClassification\"], \"classifier_from_token\": "
                        "[\"no\", \"yes\"], \"is_original_qwen3_reranker\": true}'")
    g.add_argument("--gguf-file", metavar="NAME",
                   help="which .gguf file to load when the model directory (or ORG/NAME "
                        "repo) holds several; ORG/NAME:QUANT (e.g. :Q4_K_M) picks by type")
    g.add_argument("--hf-token", nargs="?", const=True, metavar="TOKEN",
                   help="Hugging Face token for gated or private repos (default: HF_TOKEN, "
                        "else the token `hf auth login` saved; the bare flag: that one)")
    g.add_argument("--offline", action="store_true", default=None,
                   help="never reach the Hub: ORG/NAME from the HF cache only (as "
                        "HF_HUB_OFFLINE=1)")
    g.add_argument("--trust-remote-code", action="store_true", default=False,
                   help="accepted for vLLM compatibility; glowlm never runs code from a "
                        "model directory (a warning says so)")
    g.add_argument("--platform", help="force a platform by name (overrides GLOWLM_PLATFORM)")
    g.add_argument("--max-model-len", type=human_int, metavar="N",
                   help="context length, e.g. 4096, 4k (4000), 4K (4096) (default: the "
                        "model's)")
    g.add_argument("--block-size", type=int, help="KV cache block size, a multiple of the "
                   "platform's block_size_multiple (32 on every in-tree platform; default 128)")
    g.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPE_NAMES, metavar="DTYPE",
                   help="KV cache storage: auto (the model's dtype), bfloat16, float16, "
                        "float32, fp8 (= fp8_e4m3), fp8_e5m2, int8 (a scale per row); 8-bit "
                        "holds about twice the tokens "
                        "in the same GLOWLM_CPU_KVCACHE_SPACE (docs/kv-cache.md)")
    g.add_argument("--max-num-batched-tokens", type=human_int,
                   help=f"tokens per engine step (default {tokens} x world size {where})")
    g.add_argument("--max-num-seqs", type=int,
                   help=f"sequences per batch (default {seqs} x world size {where})")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=None, help="the prefix cache (default: on)")
    g.add_argument("--allow-pickle", action="store_true", default=None,
                   help="allow *.bin pickle weights (they run code when loaded)")
    g.add_argument("--seed", type=int, help="engine seed for unseeded requests (default 0)")
    g.add_argument("--speculative-config", metavar="JSON",
                   help="speculative decoding, vLLM's JSON: e.g. '{\"method\": \"ngram\", "
                        "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4}' or "
                        "method \"suffix\", or a draft model: '{\"model\": \"DRAFT_DIR\", "
                        "\"num_speculative_tokens\": 4}' (docs/speculative-decoding.md)")
    lora = p.add_argument_group("LoRA adapters (vLLM's names; docs/lora.md)")
    lora.add_argument("--enable-lora", action="store_true", default=None,
                      help="serve LoRA adapters beside the base model: requests name one by "
                           "its model name (server) or lora_request (offline)")
    lora.add_argument("--lora-modules", nargs="+", type=lora_module_arg, metavar="NAME=PATH",
                      help="adapters to load at start: name=path (a PEFT directory or a GGUF "
                           "LoRA file) or vLLM's JSON {\"name\": ..., \"path\": ..., "
                           "\"base_model_name\": ...}; implies --enable-lora")
    lora.add_argument("--max-loras", type=int, metavar="N",
                      help="adapters in one batch (slots; default 1)")
    lora.add_argument("--max-lora-rank", type=int, metavar="R",
                      help="largest adapter rank a slot holds (default 16)")
    pool = p.add_argument_group("pooling models (vLLM's names; docs/pooling.md)")
    pool.add_argument("--runner", choices=("auto", "generate", "pooling"),
                      help="generate text, or pool hidden states into embeddings / scores "
                           "(default auto: pooling for architectures that only pool, such as "
                           "BertModel)")
    pool.add_argument("--convert", choices=("auto", "none", "embed", "classify"),
                      help="the pooling task: embed (a causal LM as an embedding model) or "
                           "classify (a *ForSequenceClassification checkpoint; default auto)")
    pool.add_argument("--pooler-config", type=_json_object, metavar="JSON",
                      help="override the checkpoint's pooling, as vLLM: "
                           "'{\"pooling_type\": \"MEAN\", \"normalize\": true}' (CLS, MEAN, "
                           "LAST; normalize; dimensions; activation)")
    par = p.add_argument_group("parallelism (vLLM's names; docs/parallelism.md)")
    par.add_argument("-tp", "--tensor-parallel-size", type=int, metavar="N",
                     help="tensor-parallel ranks, one process each (auto binding: one NUMA "
                          "node per rank; recommended: the number of NUMA nodes; default 1)")
    par.add_argument("-pp", "--pipeline-parallel-size", type=int, metavar="N",
                     help="pipeline stages, the model's layers split between them; combines "
                          "with -tp (TP x PP ranks; default 1)")
    par.add_argument("--enable-expert-parallel", action="store_true", default=None,
                     help="mixture-of-experts layers: each TP rank holds experts / TP whole "
                          "experts instead of a slice of every expert (docs/models.md)")
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


def lora_module_arg(text: str) -> dict[str, Any]:
    """``name=path`` or vLLM's JSON form -> ``{"name", "path", "base_model_name"}``."""
    import json

    text = text.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"not JSON ({exc})") from None
        if not isinstance(value, dict) or not value.get("name") or not value.get("path"):
            raise argparse.ArgumentTypeError(
                'the JSON form needs "name" and "path": {"name": "sql", "path": "/adapters/sql"}')
        return {"name": str(value["name"]), "path": str(value["path"]),
                "base_model_name": value.get("base_model_name")}
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not name=path (e.g. sql=/adapters/sql)")
    return {"name": name, "path": path, "base_model_name": None}


def _json_object(text: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    if getattr(args, "trust_remote_code", False):
        logger.warning("--trust-remote-code: accepted, but glowlm runs no code from model "
                       "directories; only built-in architectures load")
    keys = ("tokenizer", "revision", "gguf_file", "hf_token", "offline", "dtype",
            "quantization", "platform", "max_model_len",
            "block_size", "kv_cache_dtype", "max_num_batched_tokens", "max_num_seqs",
            "enable_prefix_caching",
            "allow_pickle", "seed", "runner", "convert", "pooler_config", "hf_overrides",
            "speculative_config",
            "enable_lora", "max_loras", "max_lora_rank")
    keys = (*keys, "tensor_parallel_size", "pipeline_parallel_size", "enable_expert_parallel",
            "data_parallel_size",
            "nnodes", "node_rank", "master_addr", "master_port")
    out = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    if getattr(args, "lora_modules", None):
        out["enable_lora"] = True
    return out


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
