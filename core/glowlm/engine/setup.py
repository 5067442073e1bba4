"""Everything the engine needs, built once, in order, with what it chose logged.

Order matters and is the point of this module: pick the platform, resolve the
dtype through it, let it adjust the config, size the KV cache and check the
plan fits memory *before* loading weights, then load.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from glowlm import envs
from glowlm.attention.backend import kv_bytes_per_token, resolve_kv_cache_dtype
from glowlm.config import EngineConfig
from glowlm.engine.spec_decode.draft_setup import load_draft, read_draft_dir
from glowlm.errors import ConfigError, ModelLoadError
from glowlm.layers import quantization
from glowlm.layers.context import ModelParts
from glowlm.logger import init_logger
from glowlm.model_loader.loader import ModelDir, load_model, read_model_dir
from glowlm.platforms import Platform, current_selection
from glowlm.platforms.interface import dtype_name
from glowlm.runtime import hugepages

if TYPE_CHECKING:
    from glowlm.engine.spec_decode.draft_model import DraftModel

logger = init_logger(__name__)

GIB = 1 << 30


@dataclass
class EngineSetup:
    config: EngineConfig
    platform: Platform
    platform_reason: str
    info: ModelDir
    parts: ModelParts
    model: torch.nn.Module
    tokenizer: Any
    max_model_len: int
    num_blocks: int
    vocab_size: int
    #: Bytes of weights copied into 2 MiB pages after loading (runtime/hugepages.py).
    huge_page_bytes: int = 0
    #: ``generate``, or ``embed`` / ``classify`` for a pooling engine (docs/pooling.md).
    task: str = "generate"
    #: The KV cache's storage dtype (--kv-cache-dtype; the model's dtype for auto).
    kv_dtype: torch.dtype | None = None
    #: The window every layer attends within (``kv_window``), or None: the block
    #: manager gives back blocks behind it.
    kv_window: int | None = None
    #: speculative draft_model: the loaded draft (engine/spec_decode/draft_setup.py).
    draft: DraftModel | None = None


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types
        raise ModelLoadError(f"cannot load the tokenizer from {path}: {exc}") from None


def resolve_max_model_len(config: EngineConfig, info: ModelDir) -> int:
    """The model's positions, or its ``sliding_window`` when the model class does not
    attend within a window (``sliding_window_attention``; Gemma 3 does): full attention
    equals windowed attention only up to the window, so such a model stays inside it
    (Mistral v0.1's 4096, whose Llama-family layers and fused ops have no window)."""
    from glowlm.models.registry import model_class

    limit = info.max_position_embeddings
    window = getattr(info.hf_config, "sliding_window", None)
    windowed = getattr(model_class(getattr(info.hf_config, "architectures", None)),
                       "sliding_window_attention", False)
    if isinstance(window, int) and getattr(info.hf_config, "use_sliding_window", True) \
            and window < limit and not windowed:
        limit = window  # attention is full within the window, so stay inside it
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit:
        raise ConfigError(f"--max-model-len {config.max_model_len} exceeds what the model "
                          f"supports ({limit})")
    return config.max_model_len


def kv_window(info: ModelDir) -> int | None:
    """The attention window when every layer of the model has one (so the block manager
    gives back blocks behind it and a sequence needs only the window's), else None.
    Read from the config and the model class, before loading, as the layers are built
    from them (``DecoderSpec.layer_types``: Mistral, Phi-3, Starcoder2 slide on every
    layer; Gemma 2/3 and Qwen2's ``max_window_layers`` mix in full layers)."""
    from glowlm.models.registry import model_class
    from glowlm.models.spec import SLIDING

    hf = info.hf_config
    cls = model_class(getattr(hf, "architectures", None))
    window = getattr(hf, "sliding_window", None)
    family = getattr(cls, "family", None)
    if (not getattr(cls, "sliding_window_attention", False) or family is None
            or not isinstance(window, int) or window <= 0):
        return None
    types = family.layer_types(hf)
    return window if types and all(t == SLIDING for t in types) else None


def sequence_kv_tokens(config: EngineConfig, max_model_len: int, window: int | None) -> int:
    """KV tokens one sequence holds at once: all of ``max_model_len``, or with a window
    everywhere only the window, the step's chunk and a block at each end."""
    if window is None:
        return max_model_len
    return min(max_model_len, window + config.max_num_batched_tokens + 2 * config.block_size)


def gguf_head_policy(platform: Platform) -> str:
    """``GLOWLM_GGUF_NATIVE_HEAD``, with auto made ``auto-int8`` where this platform's GGUF
    layers multiply int8 activations: its 8-bit heads then stream faster natively than
    dense (native_quant_config's docstring has the figures)."""
    mode = envs.get().gguf_native_head
    if mode != "auto":
        return mode
    from glowlm.layers.quantization.gguf import act_block

    try:  # runs for every model, GGUF or not: a plugin's failure here must not stop it
        if "gguf" not in quantization.implemented(platform):
            return mode
        kernels = quantization.resolve({"quant_method": "gguf", "layers": {}},
                                       platform).kernels()  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - the plain policy then; loading reports real errors
        return mode
    # Speed, not the accuracy switch: a forced GLOWLM_GGUF_INT8_ACTIVATIONS=1 on kernels
    # whose int8 path is not fast (core's reference, plain loops) keeps 8-bit heads dense.
    fast = kernels.int8_activations and act_block(kernels, 32)
    return "auto-int8" if fast else mode


def build_engine_parts(config: EngineConfig, show_progress: bool = True,
                       link: Any = None, pooling: bool = False) -> EngineSetup:
    """``link``: this rank's side of a TP/PP group's start-up handshake (``rank``,
    ``parallel``, ``planned()``, ``agree_blocks(n)``; glowlm.distributed), None alone.
    ``pooling``: for the pooling engine (engine/pooling_engine.py), which keeps no KV
    cache across steps: no blocks are planned."""
    rank = link.rank if link is not None else 0
    selection = current_selection(config.platform)
    platform = selection.platform
    for note in platform.startup_notes():
        logger.warning(note)
    logger.info("platform %s (%s): %s", platform.name, platform.capabilities.isa,
                selection.reason)
    info = read_model_dir(config.model, config.revision, config.gguf_file,
                          gguf_head_policy(platform), config.hf_overrides)
    dtype = platform.resolve_dtype(info.dtype, config.dtype)
    config = platform.update_config(config)
    if pooling and config.speculative_config is not None:
        raise ConfigError("--speculative-config is for generation; a pooling engine "
                          "(embeddings, scores) generates no tokens to draft")
    # speculative draft_model: read and checked against the target before the plan.
    draft_info = read_draft_dir(config, info, gguf_head_policy(platform))
    quant_cfg = info.quantization_config
    if info.gguf_native and "gguf" not in quantization.implemented(platform):
        # The gguf config comes from the file's block types, not from a checkpoint
        # config: where the platform cannot run the blocks, they are dequantized.
        logger.info("the %s platform runs no GGUF blocks natively: dequantizing them to %s "
                    "at load", platform.name, dtype_name(dtype))
        quant_cfg = None
    elif info.gguf_native:
        logger.info("GGUF: %d weights run natively as 4/8-bit blocks%s; the rest is "
                    "dequantized to %s", len(info.gguf_native),
                    " (the LM head among them)" if "lm_head" in info.gguf_native else "",
                    dtype_name(dtype))
    quant = quantization.resolve(quant_cfg, platform,
                                 None if info.gguf_native else config.quantization)
    if info.gguf_native and quant is not None:
        from glowlm.layers.quantization.gguf import act_block

        kernels = quant.kernels()
        logger.info("GGUF: activations of those layers %s", (
            "quantized to int8 per 32 columns, as ggml multiplies its blocks ("
            f"{kernels.name} kernels' fast path here; GLOWLM_GGUF_INT8_ACTIVATIONS=0: "
            f"{dtype_name(dtype)})") if act_block(kernels, 32) else (
            f"in {dtype_name(dtype)} (GLOWLM_GGUF_INT8_ACTIVATIONS=1: int8 per 32 columns, "
            "as ggml)"))
    ops = platform.ops()
    if envs.get().no_fused_layers:
        ops = ops.without_fused()
    parts = ModelParts(dtype=dtype, ops=ops,
                       attention_backend=platform.attention_backend(), quant_config=quant,
                       unquantized=platform.unquantized_linear_method(),
                       expert_parallel=config.enable_expert_parallel)
    if config.enable_lora and pooling:
        raise ConfigError("--enable-lora runs on the generation engine; pooling models "
                          "(embeddings, scores) take no LoRA adapters yet")
    if config.enable_lora:
        from glowlm.lora.slots import LoRAState

        parts.lora = LoRAState(config.max_loras, config.max_lora_rank, dtype,
                               ops.lora_shrink_expand)
    if link is not None:
        parts.parallel = link.parallel
        if parts.parallel.pp_size > 1:
            import inspect

            from glowlm.models.registry import model_class

            cls = model_class(getattr(info.hf_config, "architectures", None))
            if "intermediate" not in inspect.signature(cls.forward).parameters:
                raise ConfigError(f"{cls.__name__} does not support pipeline parallelism "
                                  "yet; use --tensor-parallel-size")
        tp_group = parts.parallel.tp_group
        shared = hasattr(tp_group, "use_compiled_all_reduce")  # ranks on one host
        if shared and ops.shm_all_reduce is not None:
            tp_group.use_compiled_all_reduce(ops.shm_all_reduce)
        if parts.parallel.tp_size > 1 and rank == 0:
            if shared:
                logger.info("tensor-parallel all-reduce: shared memory, %s",
                            f"compiled ({platform.name} platform's shm_all_reduce)"
                            if ops.shm_all_reduce is not None else
                            "Python path (the platform has no compiled shm_all_reduce)")
            _log_fused_under_tp(ops)
    if not pooling:
        _check_generates(config, info)
    max_model_len = resolve_max_model_len(config, info)
    parts.max_model_len = max_model_len  # fixes length-dependent RoPE scalings
    from glowlm.runtime import binding, preload

    # Threads are placed before any weight is touched, in the thread that runs the
    # model; a server that already bound its engine thread gets its plan back.
    # A data-parallel replica's ranks come after the earlier replicas' in the plan; with
    # ranks on several hosts, each host plans its own ranks only.
    num, index = config.binding_slot(rank)
    logger.info("%s", binding.apply_for_process(num_ranks=num, rank=index,
                                                serving=config.online,
                                                rebind=num > 1).describe())
    preload.tune_glibc_malloc()  # the Python API's engines too (the CLI did it first thing)
    logger.info("%s", preload.describe())
    from glowlm.engine.memory import plan_memory  # noqa: PLC0415 - runtime is optional here

    task = "generate"
    if pooling:
        config, task = _pooling_plan(config, info, dtype, max_model_len)
    window = None if pooling else kv_window(info)
    seq_tokens = sequence_kv_tokens(config, max_model_len, window)
    plan = plan_memory(info, dtype, config, max_model_len, rank=rank, seq_tokens=seq_tokens,
                       draft=draft_info)
    logger.info("%s", plan.describe())
    if link is not None:
        link.planned()  # every rank's plan fits before any rank reads a weight
    tokenizer = None
    if pooling and getattr(info.hf_config, "classifier_from_token", None) is not None:
        from glowlm.models.pooling import classifier_token_ids

        # A causal LM scored by its LM head's rows of these tokens (Qwen3-Reranker).
        tokenizer = load_tokenizer(config.tokenizer or str(info.path))
        classifier_token_ids(info.hf_config, tokenizer)
    model = load_model(info, parts, config.allow_pickle, show_progress, pooling=pooling).model
    huge = 0 if envs.get().no_huge_pages else hugepages.move_weights(model)
    logger.info("%s", hugepages.describe(huge))
    from glowlm.layers.linear_choice import choose_for_model  # per-shape linear choice

    # Weight copies a candidate keeps (oneDNN's packed layout) may use half of what the
    # plan left spare, so the KV cache and activations still fit.
    spare = max(0, plan.available_bytes - plan.needed_bytes) // 2
    logger.info("%s", choose_for_model(model, dtype, parts.unquantized, platform,
                                       show_progress, copy_budget=spare).describe())
    if pooling:
        tokenizer = tokenizer or load_tokenizer(config.tokenizer or str(info.path))
        vocab = int(getattr(info.hf_config, "vocab_size", 0) or len(tokenizer))
        return EngineSetup(dataclasses.replace(config, max_model_len=max_model_len), platform,
                           selection.reason, info, parts, model, tokenizer, max_model_len, 0,
                           vocab, huge, task)
    kv_layers = len(getattr(model, "kv_layers", range(model.num_layers)))
    kv_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, dtype)
    per_block = kv_bytes_per_token(kv_layers, model.num_kv_heads, model.head_size,
                                   kv_dtype) * config.block_size
    num_blocks = int(plan.kv_cache_bytes // per_block)
    if config.num_kv_blocks is not None:
        num_blocks = config.num_kv_blocks
    if link is not None:
        num_blocks = link.agree_blocks(num_blocks)  # the driver's blocks exist on every rank
    if window is not None and num_blocks * config.block_size >= seq_tokens:
        logger.info("sliding window %d on every layer: blocks behind it return to the pool, "
                    "so one sequence of max_model_len %d holds at most %d KV tokens",
                    window, max_model_len, seq_tokens)
    elif num_blocks * config.block_size < max_model_len:
        if config.max_model_len is None and num_blocks > 0:
            max_model_len = num_blocks * config.block_size
            logger.warning("the KV cache holds %d tokens; max_model_len lowered to that",
                           max_model_len)
        elif window is not None:
            raise ConfigError(
                f"the KV cache ({num_blocks} blocks of {config.block_size} tokens) cannot hold "
                f"the {seq_tokens} tokens one sequence holds at once (sliding window {window} "
                f"+ max_num_batched_tokens {config.max_num_batched_tokens} + 2 blocks); raise "
                "GLOWLM_CPU_KVCACHE_SPACE or lower --max-num-batched-tokens")
        else:
            raise ConfigError(
                f"the KV cache ({plan.kv_cache_bytes / GIB:.3f} GiB = {num_blocks} blocks of "
                f"{config.block_size} tokens) cannot hold one sequence of max_model_len="
                f"{max_model_len}; raise GLOWLM_CPU_KVCACHE_SPACE or lower --max-model-len")
    logger.info("dtype %s; KV cache %d blocks x %d tokens = %d tokens (%.2f GiB); "
                "max_model_len %d", dtype_name(dtype), num_blocks, config.block_size,
                num_blocks * config.block_size, num_blocks * per_block / GIB, max_model_len)
    draft = None
    if draft_info is not None:
        own = resolve_max_model_len(dataclasses.replace(config, max_model_len=None), draft_info)
        draft = load_draft(config, draft_info, parts, platform, num_blocks, max_model_len, own,
                           show_progress, max(0, plan.available_bytes - plan.needed_bytes) // 4)
    # Only the driver tokenizes; the other ranks see token ids.
    tokenizer = load_tokenizer(config.tokenizer or str(info.path)) if rank == 0 else None
    vocab = int(getattr(info.hf_config, "vocab_size", 0) or len(tokenizer))
    config = dataclasses.replace(config, max_model_len=max_model_len)
    return EngineSetup(config, platform, selection.reason, info, parts, model, tokenizer,
                       max_model_len, num_blocks, vocab, huge, kv_dtype=kv_dtype,
                       kv_window=window, draft=draft)


def _check_generates(config: EngineConfig, info: ModelDir) -> None:
    """A generation engine refuses a pooling model with the line that says what to use."""
    from glowlm.models.registry import model_class

    cls = model_class(getattr(info.hf_config, "architectures", None))
    if getattr(cls, "is_pooling_model", False) or config.runner == "pooling":
        raise ConfigError(f"{cls.__name__} runs as a pooling model (embeddings, scores), not "
                          "in the generation engine: LLM(..., runner='pooling'), glowlm serve "
                          "--runner pooling (docs/pooling.md)")


def _pooling_plan(config: EngineConfig, info: ModelDir, dtype: torch.dtype,
                  max_model_len: int) -> tuple[EngineConfig, str]:
    """The pooling engine's task, and the config its memory plan reserves: no KV cache
    for an encoder, one step's scratch cache for a decoder (the keys and values of the
    tokens one batch computes, dropped after the step)."""
    from glowlm.engine.memory import kv_bytes_per_token as plan_kv_bytes
    from glowlm.engine.memory import model_dims
    from glowlm.models.pooling import resolve_runner
    from glowlm.models.registry import model_class

    cls = model_class(getattr(info.hf_config, "architectures", None))
    _, task = resolve_runner("pooling", config.convert, cls)
    scratch = 0
    if not getattr(cls, "is_encoder", False):
        tokens = max(config.max_num_batched_tokens, max_model_len) + 32 * config.max_num_seqs
        scratch = tokens * plan_kv_bytes(model_dims(info.hf_config), dtype)
    return dataclasses.replace(config, kv_cache_space_gib=scratch / GIB), task


def _log_fused_under_tp(ops: Any) -> None:
    """Which fused decoder ops run under tensor parallelism (start-up line): only those
    that do the all-reduces between ranks themselves (``accepts_tensor_parallel``)."""
    fused = {"rms_decoder_stack": ops.rms_decoder_stack, "decoder_stack": ops.decoder_stack,
             "ln_decoder_stack": ops.ln_decoder_stack}
    present = {n: f for n, f in fused.items() if f is not None}
    if not present:
        return
    take = [n for n, f in present.items() if getattr(f, "accepts_tensor_parallel", False)]
    rest = [n for n in present if n not in take]
    if take:
        logger.info("fused decoder stacks under tensor parallelism: %s: every layer in one "
                    "call, all-reduces between ranks in compiled code%s", ", ".join(take),
                    f"; layers for {', '.join(rest)}: module by module" if rest else "")
    else:
        logger.info("fused decoder layer/stack ops off under tensor parallelism: they run "
                    "the dense linears themselves and would skip the all-reduce between "
                    "ranks; layers run module by module")
