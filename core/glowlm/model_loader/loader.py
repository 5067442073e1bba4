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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from glowlm.errors import ModelLoadError
from glowlm.layers.context import ModelParts
from glowlm.layers.rotary import max_positions
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
    #: Positions the model serves: the config's, stretched by a linear / dynamic / YaRN
    #: RoPE factor (:func:`glowlm.layers.rotary.max_positions`).
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
                   gguf_file: str | None = None, gguf_head: str | None = None,
                   hf_overrides: dict[str, Any] | None = None) -> ModelDir:
    """Resolve MODEL, then read config.json and generation_config.json; no weights, no
    tokenizer. ``gguf_head``: the GGUF LM-head policy (default ``GLOWLM_GGUF_NATIVE_HEAD``;
    the engine passes ``auto-int8`` where the platform's GGUF layers take int8
    activations, :func:`glowlm.model_loader.gguf.native_quant_config`).
    ``hf_overrides``: vLLM's ``--hf-overrides``, config fields set over the checkpoint's
    (``architectures`` too, so a causal-LM checkpoint can load as another class)."""
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
    overrides = dict(hf_overrides or {})
    if "architectures" in overrides:
        raw["architectures"] = overrides["architectures"]
    model_class(raw.get("architectures"))  # unknown architecture: fail before transformers
    from transformers import AutoConfig

    try:
        hf_config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types
        raise ModelLoadError(f"{config_file}: {type(exc).__name__}: {exc}") from None
    for key, value in overrides.items():
        setattr(hf_config, key, value)
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
        max_position_embeddings=max_positions(hf_config, int(max_pos)),
        quantization_config=quant,
        gguf_file=source.gguf_file, source=source.spec, gguf_native=native,
    )


def load_model(info: ModelDir, parts: ModelParts, allow_pickle: bool = False,
               show_progress: bool = True, pooling: bool = False) -> LoadedModel:
    """Build the model for ``parts`` (dtype, platform ops, backend) and read its weights.

    ``pooling``: the architecture as a pooling model (a causal LM pools its hidden
    states and builds no LM head; :func:`glowlm.models.pooling.as_pooling_model`)."""
    cls = model_class(getattr(info.hf_config, "architectures", None))
    if pooling:
        from glowlm.models.pooling import as_pooling_model

        cls = as_pooling_model(cls)
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
    count = parameter_count(model)  # logical sizes: the same before and after repacking
    bar = tqdm(total=total, desc="Loading weights", unit="tensor", file=sys.stderr,
               disable=not show_progress, leave=False)
    expected = model.expected_names()
    repack = _Repacker(model, expected)
    try:
        loaded = model.load_weights(tensors, progress=bar.update, loaded=repack.loaded)
    finally:
        bar.close()
    missing = sorted(expected - loaded)
    if missing:
        shown = ", ".join(m.replace("#", " shard ") for m in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelLoadError(f"{info.display}: the checkpoint lacks tensor(s) {shown}{more}")
    repack.finish()
    logger.info("loaded %s (%s, %.1fM parameters) from %s", cls.__name__,
                str(parts.dtype).removeprefix("torch."), count / 1e6, info.display)
    return LoadedModel(model, parts, info)


class _Repacker:
    """Runs each layer's ``process_weights_after_loading`` as soon as all its weights are
    in, not after the whole checkpoint: a quantized layer holds its checkpoint-shaped
    tensors (GGUF's canonical uint8 per weight, 1.25 bytes with its scales) only until
    the kernels repack them, so the load's peak is the model plus one layer's unpacked
    copy rather than every layer's (a 30 B MoE file's experts would need 37 GB)."""

    def __init__(self, model: torch.nn.Module, expected: set[str]) -> None:
        self.modules: dict[str, torch.nn.Module] = {}
        for name, module in model.named_modules():
            method = getattr(module, "method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                self.modules[name] = module
        #: layer -> the expected names it still waits for
        self.pending: dict[str, set[str]] = {}
        for key in expected:
            owner = _owner(key)
            if owner in self.modules:
                self.pending.setdefault(owner, set()).add(key)
        self.done: set[str] = set()
        #: what ``load_weights`` fills; each name it adds may complete a layer
        self.loaded: set[str] = _Loaded(self)

    def mark(self, key: str) -> None:
        owner = _owner(key)
        waiting = self.pending.get(owner)
        if waiting is not None:
            waiting.discard(key)
            if not waiting:
                del self.pending[owner]
                self._process(owner)

    def finish(self) -> None:
        """After the checkpoint: the layers not yet repacked (those without weights of
        their own, or sharing a tied one)."""
        for owner in self.modules:
            if owner not in self.done:
                self._process(owner)

    def _process(self, owner: str) -> None:
        module = self.modules[owner]
        module.method.process_weights_after_loading(module)
        self.done.add(owner)


def _owner(key: str) -> str:
    """The module of an expected name (``a.b.qkv_proj.weight#q`` -> ``a.b.qkv_proj``)."""
    return key.split("#", 1)[0].rsplit(".", 1)[0]


class _Loaded(set):
    """A set of loaded names that tells the repacker of each addition."""

    def __init__(self, repack: _Repacker) -> None:
        super().__init__()
        self.repack = repack

    def add(self, key: str) -> None:
        if key not in self:
            super().add(key)
            self.repack.mark(key)

    def update(self, *others: Iterable[str]) -> None:
        for keys in others:
            for key in keys:
                self.add(key)


def parameter_count(model: torch.nn.Module) -> int:
    """The model's parameters as the architecture counts them, before quantized layers
    repack theirs: a linear layer is input x output weights (+ its bias) and an embedding
    or LM head rows x hidden, whatever the shapes of their packed tensors (a 4-bit
    layer's hold an eighth of the numbers plus scales, and after repacking none are
    parameters at all: a GGUF model counted "0M"); a MoE layer is its experts' three
    projections. A tied head is counted once."""
    from glowlm.layers.embedding import VocabParallelEmbedding
    from glowlm.layers.linear import LinearBase
    from glowlm.layers.moe import FusedMoE

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
        elif isinstance(module, FusedMoE):  # gate, up and down of every expert
            logical[id(module)] = module.local_experts * 3 * module.inter * module.hidden_size
            owned.update(id(p) for p in mine.values())
    return sum(logical.values()) + sum(p.numel() for p in model.parameters()
                                       if id(p) not in owned)
