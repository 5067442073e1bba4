"""Load a model: config, tokenizer, generation defaults, weights.

The model is a local Hugging Face directory, a GGUF file, or an ``ORG/NAME`` id in
the Hugging Face cache (:mod:`glowlm.model_loader.resolve`); a GGUF file's metadata
is read through a converted directory and its tensors from the file itself
(:mod:`glowlm.model_loader.gguf`, :mod:`glowlm.model_loader.gguf_weights`).

Every failure a user can cause (missing file, wrong shape, unknown architecture,
pickle weights) becomes one :class:`~glowlm.errors.ModelLoadError` line naming the
file or tensor. Weights are read one tensor at a time into parameters that were
allocated once in the target dtype, so peak memory is the model plus one tensor.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from glowlm.errors import ModelLoadError
from glowlm.layers.context import ModelParts
from glowlm.logger import init_logger
from glowlm.model_loader.checkpoint import count_tensors, iterate_tensors, weight_files
from glowlm.models.registry import model_class

logger = init_logger(__name__)


@dataclass
class ModelDir:
    """What a model directory says about itself, before any weight is read."""

    path: Path
    hf_config: Any
    dtype: torch.dtype                 # the model's own dtype (config torch_dtype)
    eos_token_ids: list[int] = field(default_factory=list)
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    max_position_embeddings: int = 2048
    quantization_config: dict[str, Any] | None = None
    #: The weights, when they come from a GGUF file (``path`` then holds the metadata).
    gguf_file: Path | None = None
    #: What the user named (a path, ``ORG/NAME``, ``default``), for log lines.
    source: str = ""
    #: GGUF weights run natively, HF module name -> (bits, group) of its layer
    #: (quantization_config is then the ``gguf`` one).
    gguf_native: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def display(self) -> str:
        return str(self.gguf_file or self.path)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    parts: ModelParts
    info: ModelDir


def _model_dtype(hf_config: Any) -> torch.dtype:
    raw = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(raw, torch.dtype):
        return raw
    if isinstance(raw, str) and hasattr(torch, raw):
        return getattr(torch, raw)
    return torch.float32


def read_model_dir(path: str | Path | None, revision: str | None = None,
                   gguf_file: str | None = None, gguf_head: str | None = None) -> ModelDir:
    """Resolve MODEL, then read config.json and generation_config.json; no weights, no
    tokenizer. ``gguf_head``: the GGUF LM-head policy (default ``GLOWLM_GGUF_NATIVE_HEAD``;
    the engine passes ``auto-int8`` where the platform's GGUF layers take int8
    activations, :func:`glowlm.model_loader.gguf.native_quant_config`)."""
    from glowlm.model_loader.resolve import resolve_model

    source = resolve_model(path, revision, gguf_file)
    model_dir = source.path
    config_file = model_dir / "config.json"
    if not config_file.exists():
        raise ModelLoadError(f"{config_file} is missing")
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{config_file}: invalid JSON ({exc})") from None
    model_class(raw.get("architectures"))  # unknown architecture: fail before transformers
    from transformers import AutoConfig

    try:
        hf_config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types
        raise ModelLoadError(f"{config_file}: {type(exc).__name__}: {exc}") from None
    eos = raw.get("eos_token_id")
    gen: dict[str, Any] = {}
    gen_file = model_dir / "generation_config.json"
    if gen_file.exists():
        try:
            gen = json.loads(gen_file.read_text())
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{gen_file}: invalid JSON ({exc})") from None
        eos = gen.get("eos_token_id", eos)
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    quant = raw.get("quantization_config")
    native: dict[str, tuple[int, int]] = {}
    if source.gguf_file is not None and quant is None:
        from glowlm import envs
        from glowlm.model_loader import gguf

        # Native blocks by default (GLOWLM_GGUF_NATIVE=0 dequantizes): where the
        # platform cannot run them, engine setup dequantizes them anyway.
        if envs.get().gguf_native:
            cls = model_class(raw.get("architectures"))
            quant, native = gguf.native_quant_config(
                source.gguf_file, getattr(cls, "stacked_params", []),
                bool(getattr(hf_config, "tie_word_embeddings", False)),
                gguf_head or envs.get().gguf_native_head)
    max_pos = (getattr(hf_config, "max_position_embeddings", None)
               or getattr(hf_config, "n_positions", None) or 2048)
    return ModelDir(
        path=model_dir, hf_config=hf_config, dtype=_model_dtype(hf_config),
        eos_token_ids=eos_ids,
        generation_defaults={k: gen[k] for k in ("temperature", "top_p", "top_k",
                                                 "repetition_penalty") if k in gen},
        max_position_embeddings=int(max_pos),
        quantization_config=quant,
        gguf_file=source.gguf_file, source=source.spec, gguf_native=native,
    )


def load_model(info: ModelDir, parts: ModelParts, allow_pickle: bool = False,
               show_progress: bool = True) -> LoadedModel:
    """Build the model for ``parts`` (dtype, platform ops, backend) and read its weights."""
    cls = model_class(getattr(info.hf_config, "architectures", None))
    if info.gguf_file is not None:
        from glowlm.model_loader import gguf, gguf_weights

        native = info.gguf_native if getattr(parts.quant_config, "name", "") == "gguf" \
            else {}
        tensors = gguf_weights.iterate_tensors(info.gguf_file, info.hf_config, parts.dtype, native)
        total: int | None = gguf.count_tensors(info.gguf_file) + 2 * len(native)
    else:
        files = weight_files(info.path, allow_pickle)
        tensors = iterate_tensors(files, parts.dtype)
        total = count_tensors(files) or None
    with torch.device("cpu"):
        model = cls(info.hf_config, parts)
    model.eval()
    bar = tqdm(total=total, desc="Loading weights", unit="tensor", file=sys.stderr,
               disable=not show_progress, leave=False)
    try:
        loaded = model.load_weights(tensors, progress=bar.update)
    finally:
        bar.close()
    missing = sorted(model.expected_names() - loaded)
    if missing:
        shown = ", ".join(m.replace("#", " shard ") for m in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelLoadError(f"{info.display}: the checkpoint lacks tensor(s) {shown}{more}")
    count = parameter_count(model)
    for module in model.modules():
        method = getattr(module, "method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)
    logger.info("loaded %s (%s, %.1fM parameters) from %s", cls.__name__,
                str(parts.dtype).removeprefix("torch."), count / 1e6, info.display)
    return LoadedModel(model, parts, info)


def parameter_count(model: torch.nn.Module) -> int:
    """The model's parameters as the architecture counts them, before quantized layers
    repack theirs: a linear layer is input x output weights (+ its bias) and an embedding
    or LM head rows x hidden, whatever the shapes of their packed tensors (a 4-bit
    layer's hold an eighth of the numbers plus scales, and after repacking none are
    parameters at all: a GGUF model counted "0M"). A tied head is counted once."""
    from glowlm.layers.embedding import VocabParallelEmbedding
    from glowlm.layers.linear import LinearBase

    logical: dict[int, int] = {}
    owned: set[int] = set()
    for module in model.modules():
        mine = dict(module.named_parameters(recurse=False))
        if isinstance(module, LinearBase):
            logical[id(module)] = module.input_size * sum(module.output_sizes)
            owned.update(id(p) for name, p in mine.items() if name != "bias")
        elif isinstance(module, VocabParallelEmbedding) and mine:
            key = id(mine["weight"]) if "weight" in mine else id(module)  # packed: qweight..
            logical[key] = module.per_rank * module.hidden_size
            owned.update(id(p) for p in mine.values())
    return sum(logical.values()) + sum(p.numel() for p in model.parameters()
                                       if id(p) not in owned)
