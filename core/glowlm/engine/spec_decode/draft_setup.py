"""The draft model of ``draft_model`` speculation, read and loaded as the target is.

Engine set-up (:mod:`glowlm.engine.setup`) calls :func:`read_draft_dir` right after the
target's config, before the memory plan (which counts the draft's weights and KV
cache), and :func:`load_draft` once the target's cache is sized: the draft gets the
target's platform, ops, dtype and KV-cache dtype, its own attention backend instance,
and a KV cache of as many blocks as the target's (the memory plan split the KV space
between the two in proportion to their bytes per token, so both hold the same tokens).
What cannot work is refused here in one line: a vocabulary that is not the target's
(another tokenizer), a directory that cannot be read, a pooling architecture.
"""

from __future__ import annotations

from glowlm.attention.backend import kv_bytes_per_token, resolve_kv_cache_dtype
from glowlm.config import EngineConfig
from glowlm.engine.spec_decode.draft_model import DraftModel
from glowlm.errors import ConfigError, ModelLoadError
from glowlm.layers import quantization
from glowlm.layers.context import ModelParts
from glowlm.logger import init_logger
from glowlm.model_loader.loader import ModelDir, load_model, read_model_dir
from glowlm.platforms import Platform
from glowlm.platforms.interface import dtype_name

logger = init_logger(__name__)

GIB = 1 << 30


def _vocab(info: ModelDir) -> int:
    return int(getattr(info.hf_config, "vocab_size", 0) or 0)


def read_draft_dir(config: EngineConfig, target: ModelDir, gguf_head: str) -> ModelDir | None:
    """The draft model's directory (config only, no weights), checked against the
    target's; None unless the speculative method is ``draft_model``."""
    spec = config.speculative_config
    if spec is None or spec.method != "draft_model":
        return None
    assert spec.model is not None
    where = f"speculative_config model {spec.model!r} (the draft model)"
    try:
        info = read_model_dir(spec.model, spec.revision, None, gguf_head)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{where}: {exc}") from None
    from glowlm.models.registry import model_class

    cls = model_class(getattr(info.hf_config, "architectures", None))
    if getattr(cls, "is_pooling_model", False):
        raise ConfigError(f"{where}: {cls.__name__} is a pooling model; a draft model must "
                          "generate (a causal LM)")
    mine, theirs = _vocab(info), _vocab(target)
    if mine != theirs:
        raise ConfigError(f"{where}: its vocabulary has {mine} tokens and the target's "
                          f"{theirs}: a draft model must share the target's tokenizer")
    return info


def draft_max_model_len(config: EngineConfig, own: int, target_len: int) -> int:
    """The positions the draft serves: its own ``own`` (what the engine would serve it at,
    ``setup.resolve_max_model_len``), the config's ``max_model_len`` and the target's,
    whichever is least."""
    spec = config.speculative_config
    assert spec is not None
    return min(own, target_len, spec.max_model_len or target_len)


def load_draft(config: EngineConfig, info: ModelDir, target: ModelParts, platform: Platform,
               num_blocks: int, target_len: int, own_len: int, show_progress: bool,
               copy_budget: int) -> DraftModel:
    """Load the draft on the target's platform and dtype; its cache holds ``num_blocks``
    blocks of the target's block size; ``own_len``: the draft's own positions."""
    from glowlm import envs
    from glowlm.layers.linear_choice import choose_for_model
    from glowlm.runtime import hugepages

    spec = config.speculative_config
    assert spec is not None
    dtype = target.dtype
    quant_cfg = info.quantization_config
    if info.gguf_native and "gguf" not in quantization.implemented(platform):
        quant_cfg = None  # dequantized at load, as the target's would be
    quant = quantization.resolve(quant_cfg, platform,
                                 None if info.gguf_native else spec.quantization)
    max_len = draft_max_model_len(config, own_len, target_len)
    parts = ModelParts(dtype=dtype, ops=target.ops, attention_backend=platform.attention_backend(),
                       quant_config=quant, unquantized=platform.unquantized_linear_method(),
                       max_model_len=max_len)
    model = load_model(info, parts, config.allow_pickle, show_progress).model
    if not envs.get().no_huge_pages:
        hugepages.move_weights(model)
    choice = choose_for_model(model, dtype, parts.unquantized, platform, show_progress,
                              copy_budget=copy_budget)
    logger.info("draft model: %s", choice.describe())
    kv_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, dtype)
    per_block = kv_bytes_per_token(model.num_layers, model.num_kv_heads, model.head_size,
                                   kv_dtype) * config.block_size
    logger.info("draft model %s (%d layers, %s): KV cache %d blocks x %d tokens = %d tokens "
                "(%.3f GiB); drafts %d tokens per step; max positions %d", info.display,
                model.num_layers, dtype_name(dtype), num_blocks, config.block_size,
                num_blocks * config.block_size, num_blocks * per_block / GIB,
                spec.num_speculative_tokens, max_len)
    return DraftModel(model, parts.attention_backend, num_blocks, config.block_size, kv_dtype,
                      max_len, info.display)

