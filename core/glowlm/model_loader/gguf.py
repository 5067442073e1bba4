"""GGUF files: header and metadata, Hugging Face names, which layers run natively.

A GGUF file carries everything a model directory does (config, tokenizer, chat
template, weights) in one file, in llama.cpp's naming. glowlm reads it so the rest
of the engine sees an ordinary Hugging Face model:

* **Metadata** becomes a small directory (``config.json``, ``generation_config.json``,
  tokenizer files) under :envvar:`GLOWLM_GGUF_CACHE`, converted once per file
  (:mod:`glowlm.model_loader.gguf_metadata`); this module reads the header
  (:func:`inspect`), names each tensor as the models load it (:func:`hf_name`) and
  decides from the tensor types which linear weights (and the LM head) are handed over
  as their blocks, in a block type the platform runs natively
  (:func:`native_quant_config`, :mod:`glowlm.layers.quantization.gguf`;
  ``GLOWLM_GGUF_NATIVE=0`` dequantizes all).
* **Tensors** are :mod:`glowlm.model_loader.gguf_weights`'s: renamed, the converter's
  layout changes undone, dequantized to the run dtype one tensor at a time (or split
  into native blocks), so peak memory stays the model plus one tensor.

Every problem a user can cause (not a GGUF file, a truncated file, an architecture
or tensor type glowlm does not read) is one :class:`~glowlm.errors.ModelLoadError`
line naming the file.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from glowlm.errors import ModelLoadError
from glowlm.logger import init_logger

logger = init_logger(__name__)

MAGIC = b"GGUF"
#: GGUF ``general.architecture`` -> the Hugging Face architecture glowlm builds.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "starcoder2": "Starcoder2ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    # BERT-family embedders as llama.cpp's converter writes them (docs/pooling.md); a
    # file with a classifier head (cls.output) is a cross-encoder.
    "bert": "BertModel",
}
#: ``llama`` files with ``llama.expert_count`` > 0 are Mixtral (llama.cpp writes it so).
LLAMA_WITH_EXPERTS = "MixtralForCausalLM"
#: Tensor types read (and what they are): the float types as they are, the rest
#: dequantized (or run natively: glowlm.layers.quantization.gguf.NATIVE_TYPES).
#: Q8_0/Q4_0/Q4_1 (32-element blocks, one scale (and min)) are dequantized in torch
#: (gguf_weights.dequantize); the K-quants and Q5 types through the ``gguf`` package.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K",
                   "Q3_K", "Q4_K", "Q5_K", "Q6_K")

_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
#: llama.cpp tensor name (inside a block) -> Hugging Face name (inside ``model.layers.N``).
_LLAMA_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # Mixture of experts: the router, every expert's projection stacked in one 3-D
    # tensor ([experts, out, in]), and Qwen2-MoE's shared expert and its gate.
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
#: Gemma 3 has four norms per layer; llama.cpp's ``ffn_norm`` is its pre-MLP norm.
_GEMMA3_LAYER = {
    **_LLAMA_LAYER,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
#: Starcoder2's MLP is ``c_fc`` / ``c_proj``, llama.cpp's ``ffn_up`` / ``ffn_down``.
_STARCODER2_LAYER = {**_LLAMA_LAYER, "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
#: Per-architecture layer tables (Gemma 2's are Gemma 3's: four norms, no q/k norm).
#: Phi-3's q|k|v and gate|up are one tensor each in the file, as in its checkpoint.
_PHI3_LAYER = {**_LLAMA_LAYER, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
_LAYER_TABLES = {"gemma3": _GEMMA3_LAYER, "gemma2": _GEMMA3_LAYER,
                 "starcoder2": _STARCODER2_LAYER, "phi3": _PHI3_LAYER}
#: Tensors that hold several projections in the file: dequantized at load (the native
#: block layers take one tensor per projection).
FUSED_IN_FILE = (".qkv_proj", ".gate_up_proj")
#: Architectures whose converter stores Gemma's norms as ``1 + w``.
GEMMA_NORMS = ("gemma2", "gemma3")
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
           "output": "lm_head"}
#: llama.cpp's BERT names (gguf's tensor map for MODEL_ARCH.BERT) -> transformers'.
_BERT_LAYER = {
    "attn_q": "attention.self.query", "attn_k": "attention.self.key",
    "attn_v": "attention.self.value", "attn_output": "attention.output.dense",
    "attn_output_norm": "attention.output.LayerNorm", "ffn_up": "intermediate.dense",
    "ffn_down": "output.dense", "layer_output_norm": "output.LayerNorm",
}
#: The classifier head: ``cls`` (dense, tanh) and ``cls.output`` (the labels), which is
#: BERT's pooler + classifier.
_BERT_GLOBAL = {"token_embd": "embeddings.word_embeddings",
                "token_types": "embeddings.token_type_embeddings",
                "position_embd": "embeddings.position_embeddings",
                "token_embd_norm": "embeddings.LayerNorm", "cls": "pooler.dense",
                "cls.output": "classifier"}


def _reader(path: Path) -> Any:
    """A ``gguf.GGUFReader`` for ``path`` (parsed once per file version: the header of a
    large vocabulary takes seconds), or one readable line saying why not."""
    try:
        st = Path(path).stat()
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read ({exc.strerror})") from None
    return _cached_reader(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _cached_reader(name: str, size: int, mtime_ns: int) -> Any:
    path = Path(name)
    try:
        import gguf
    except ImportError:
        raise ModelLoadError("reading GGUF files needs the `gguf` package: "
                             "pip install gguf") from None
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read ({exc.strerror})") from None
    if magic != MAGIC:
        raise ModelLoadError(f"{path}: not a GGUF file (it starts with {magic!r}, not "
                             f"{MAGIC!r})")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - the reader raises several types on bad files
        raise ModelLoadError(f"{path}: broken or truncated GGUF file ({type(exc).__name__}: "
                             f"{exc})") from None
    size = path.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise ModelLoadError(f"{path}: truncated GGUF file: tensor {t.name} ends at byte "
                                 f"{end:,} but the file has {size:,} bytes")
    return reader


def field(reader: Any, key: str, default: Any = None) -> Any:
    """A metadata value (str, number, list), or ``default`` when absent."""
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception:  # noqa: BLE001 - a malformed field reads as absent
        return default


@dataclass(frozen=True)
class GGUFInfo:
    """What the header says, before any conversion."""

    path: Path
    architecture: str       # GGUF general.architecture
    hf_architecture: str    # what glowlm builds
    name: str
    tensor_types: dict[str, int]
    num_tensors: int

    @property
    def quantized(self) -> bool:
        return any(t not in ("F32", "F16", "BF16") for t in self.tensor_types)


def inspect(path: str | Path) -> GGUFInfo:
    """Read the header: architecture, tensor types; checks the file is complete."""
    path = Path(path)
    reader = _reader(path)
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(f"{path}: GGUF architecture {arch!r} is not supported; "
                             f"supported: {', '.join(sorted(ARCHITECTURES))}")
    types: dict[str, int] = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    unknown = sorted(set(types) - set(SUPPORTED_TYPES))
    if unknown:
        raise ModelLoadError(f"{path}: tensor type(s) {', '.join(unknown)} are not supported "
                             f"(supported: {', '.join(SUPPORTED_TYPES)})")
    hf_arch = ARCHITECTURES[arch]
    if arch == "llama" and int(field(reader, "llama.expert_count", 0) or 0) > 0:
        hf_arch = LLAMA_WITH_EXPERTS
    if arch == "bert" and any(t.name == "cls.output.weight" for t in reader.tensors):
        hf_arch = "BertForSequenceClassification"
    return GGUFInfo(path, arch, hf_arch, str(field(reader, "general.name", path.stem)),
                    types, len(reader.tensors))


# -- names --------------------------------------------------------------------------


def hf_name(arch: str, name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None for tensors glowlm derives
    itself (``rope_freqs``: the rotary tables come from the config)."""
    stem, _, suffix = name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    m = _LAYER.match(stem)
    if arch == "bert":
        if m:
            part = _BERT_LAYER.get(m.group(2))
            return None if part is None else f"encoder.layer.{m.group(1)}.{part}.{suffix}"
        base = _BERT_GLOBAL.get(stem)
        return None if base is None else f"{base}.{suffix}"
    if m:
        table = _LAYER_TABLES.get(arch, _LLAMA_LAYER)
        part = table.get(m.group(2))
        return None if part is None else f"model.layers.{m.group(1)}.{part}.{suffix}"
    base = _GLOBAL.get(stem)
    return None if base is None else f"{base}.{suffix}"


# -- natively run layers -----------------------------------------------------------


def native_quant_config(path: str | Path, stacked: list[tuple[str, str, Any]],
                        tied: bool = False, head: str = "auto"
                        ) -> tuple[dict[str, Any] | None, dict[str, tuple[int, int]]]:
    """The ``gguf`` quantization config for the layers whose every part is a natively run
    block type, and the HF module names of those parts with the (bits, group) of their
    layer.

    ``stacked`` is the model's ``(fused, part, shard)`` list: q/k/v become ``qkv_proj``
    only if all three are native types, as one format (the widest bits, the smallest
    group: :func:`~glowlm.layers.quantization.gguf.layer_format`). Norms stay dense.

    The LM head (``token_embd`` when ``tied``: the model then looks its embedding rows up
    in the head's blocks; else ``output``) per ``head`` (``GLOWLM_GGUF_NATIVE_HEAD``):
    ``"1"`` native when its type is, ``"0"`` dense, ``"auto"`` native when it runs 4-bit,
    ``"auto-int8"`` (what the engine asks for where the platform's GGUF layers take int8
    activations, ``GLOWLM_GGUF_INT8_ACTIVATIONS``) native at 4 and 8 bits.
    Why auto keeps 8-bit heads dense: measured on x86 (Zen 5, 2 threads, bf16), the
    8-bit weight-only kernel is compute-bound at M = 1 (Gemma 3's 262144 x 640 Q8_0
    head: 6.9 ms for 178 MB) where the dense bf16 GEMV streams twice the bytes faster
    (5.7 ms for 335 MB); decode was 81 vs 104 tok/s (Gemma 3 270M) and 200 vs 232
    (SmolLM2), while a 4-bit head (3.5 ms) beats both. With int8 activations the 8-bit
    head streams at ~85 % of the read bandwidth (Zen 2, AVX2, 2 threads, bench_quant
    gguf8: 262144 x 640 6.9 ms against the dense bf16 GEMV's 10.0 ms; 49152 x 576 1.2 ms
    against 2.3 ms), so there it is native.
    """
    from glowlm.layers.quantization.gguf import NATIVE_TYPES, layer_format

    reader = _reader(Path(path))
    arch = field(reader, "general.architecture")
    types: dict[str, str] = {}
    head_type: str | None = None
    for t in reader.tensors:
        name = hf_name(arch, t.name)
        if name and name.removesuffix(".weight").endswith(FUSED_IN_FILE):
            continue  # fused projections (Phi-3's qkv, gate_up): dequantized when loaded
        if name and name.endswith(".weight") and name.startswith(("model.layers.",
                                                                   "encoder.layer.")):
            types[name.removesuffix(".weight")] = t.tensor_type.name
        elif name == ("model.embed_tokens.weight" if tied else "lm_head.weight"):
            head_type = t.tensor_type.name
    # Stacked experts: gate and up run as one ``w13`` layer, down as ``w2``
    # (:mod:`glowlm.layers.quantization.moe`).
    fused_of = {part: fused for fused, part, _ in stacked}
    groups: dict[str, list[str]] = {}
    for module in types:
        prefix, _, leaf = module.rpartition(".")
        table = _EXPERT_LAYERS if prefix.endswith(".experts") else fused_of
        groups.setdefault(f"{prefix}.{table.get(leaf, leaf)}", []).append(module)
    if head_type in NATIVE_TYPES and (head in ("1", "auto-int8") or
                                       (head == "auto" and NATIVE_TYPES[head_type][0] == 4)):
        types["lm_head"] = head_type
        groups["lm_head"] = ["lm_head"]
    layers: dict[str, list[int]] = {}
    native: dict[str, tuple[int, int]] = {}
    for prefix, members in groups.items():
        if prefix.endswith("norm") or any(types[m] not in NATIVE_TYPES for m in members):
            continue
        bits, group = layer_format(types[m] for m in members)
        layers[prefix] = [bits, group]
        native.update((m, (bits, group)) for m in members)
    if not layers:
        return None, {}
    return {"quant_method": "gguf", "layers": layers}, native


#: A stacked expert tensor's HF leaf -> the FusedMoE projection it is part of.
_EXPERT_LAYERS = {"gate_proj": "w13", "up_proj": "w13", "down_proj": "w2"}


def count_tensors(path: str | Path) -> int:
    return inspect(path).num_tensors


def is_gguf(path: str | Path) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    try:
        with open(p, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def weight_bytes(path: str | Path, elem: int,
                 native: dict[str, tuple[int, int]] | None = None) -> tuple[int, int]:
    """(bytes, largest tensor's bytes) of the loaded weights: what the memory plan needs
    before loading. Tensors are dequantized to ``elem``-byte floats, except those of the
    natively run layers (``native``: HF module -> (bits, group), from
    :func:`native_quant_config`), which stay ``bits`` per weight plus a float32 scale and
    zero per group (the canonical form the kernels repack from; a MoE model's experts
    are most of its bytes, so counting them dequantized would refuse a Q4_K_M file that
    fits)."""
    reader = _reader(Path(path))
    arch = field(reader, "general.architecture")
    native = native or {}
    sizes = []
    for t in reader.tensors:
        numel = int(np.prod(t.shape.tolist()))
        name = hf_name(arch, t.name) or ""
        fmt = native.get(name.removesuffix(".weight"))
        sizes.append(numel * elem if fmt is None else numel * fmt[0] // 8 + numel // fmt[1] * 8)
    return sum(sizes), max(sizes, default=0)
