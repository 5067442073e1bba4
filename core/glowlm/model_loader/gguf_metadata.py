"""A GGUF file's metadata as a Hugging Face style directory, converted once per file.

``config.json``, ``generation_config.json`` and the tokenizer files come from
transformers' GGUF conversion, with what it misses added from the header (the
attention width, Gemma's query scale and Gemma 2's soft-caps, linear / YaRN rope
scaling, Phi-3's LongRoPE factors and window, the chat template's end-of-turn token as
an EOS), under :envvar:`GLOWLM_GGUF_CACHE`. The conversion walks the whole vocabulary
(seconds); the cached directory is reused while the file's size and modification time
are unchanged. The tensors are :mod:`glowlm.model_loader.gguf`'s part.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from glowlm.errors import ModelLoadError
from glowlm.logger import init_logger
from glowlm.model_loader.gguf import GGUFInfo, _reader, field, inspect

logger = init_logger(__name__)

#: Bumped when the metadata conversion changes, so old cached directories are redone.
CONVERTER_VERSION = 6


def _file_dtype(info: GGUFInfo) -> str:
    """The dtype the model runs in by default: bf16 for quantized files (their weights
    are dequantized, and bf16 keeps them at half the bytes of fp32), else the file's."""
    floats = {t: n for t, n in info.tensor_types.items() if t in ("F16", "BF16")}
    if info.quantized or not floats:
        return "bfloat16" if info.quantized else "float32"
    return "float16" if max(floats, key=floats.__getitem__) == "F16" else "bfloat16"


def cache_root() -> Path:
    from glowlm import envs

    return Path(envs.get().gguf_cache).expanduser()


def metadata_dir(path: str | Path, root: Path | None = None) -> Path:
    """A Hugging Face style directory (config, tokenizer, generation config) for ``path``.

    Converted once per file version and cached; a half-written conversion is never
    used (it is built in a temporary directory and renamed into place).
    """
    path = Path(os.path.abspath(path))  # a cache snapshot's link keeps its file name
    info = inspect(path)
    st = path.stat()
    key = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}|{CONVERTER_VERSION}".encode()
                         ).hexdigest()[:16]
    out = (root or cache_root()) / f"{path.stem}-{key}"
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    logger.info("converting the GGUF metadata of %s (once; cached in %s)", path.name, out)
    try:
        _convert(path, info, tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _convert(path: Path, info: GGUFInfo, out: Path) -> None:
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    if info.architecture == "bert":  # transformers reads no BERT GGUF: glowlm's own
        from glowlm.model_loader.gguf_bert import convert_bert

        convert_bert(path, info, _reader(path), out)
        return

    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types
        raise ModelLoadError(f"{path}: cannot read the model config from the GGUF metadata "
                             f"({type(exc).__name__}: {exc})") from None
    raw = config.to_dict()
    reader = _reader(path)
    # transformers' key table misses the attention width for some architectures (qwen3);
    # llama.cpp always writes it when it differs from hidden / heads.
    key_length = field(reader, f"{info.architecture}.attention.key_length")
    if isinstance(key_length, int) and key_length > 0:
        raw["head_dim"] = key_length
        if info.architecture in _GEMMA_27B_LAYERS:
            # No GGUF key holds it; llama.cpp scales queries by head_dim ** -0.5 except in
            # the 27B models (hidden / heads; Gemma 3's has 62 layers, Gemma 2's 46).
            # transformers' default is 256.
            heads = int(raw.get("num_attention_heads") or 1)
            big = raw.get("num_hidden_layers") == _GEMMA_27B_LAYERS[info.architecture]
            raw["query_pre_attn_scalar"] = raw["hidden_size"] // heads if big else key_length
    if info.architecture == "gemma2":
        # Gemma 2's soft-caps (transformers' GGUF table reads neither; absent: none).
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            raw[key] = field(reader, f"gemma2.{key}")
    raw.update(_moe_fields(reader, info))
    if info.architecture == "phi3":
        raw.update(_phi3_fields(reader, raw))
    scaling = _rope_scaling(reader, info.architecture) or _rope_freqs(reader)
    if scaling:
        # transformers' GGUF table reads no rope scaling for these architectures.
        raw["rope_scaling"] = raw["rope_parameters"] = {
            **scaling, "rope_theta": (raw.get("rope_parameters") or {}).get(
                "rope_theta", raw.get("rope_theta", 10000.0))}
    raw["architectures"] = [info.hf_architecture]
    raw["torch_dtype"] = _file_dtype(info)
    raw.pop("_name_or_path", None)
    raw.pop("_model_name_or_path", None)
    (out / "config.json").write_text(json.dumps(raw, indent=2, default=str))
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"{path}: cannot build the tokenizer from the GGUF metadata "
                             f"({type(exc).__name__}: {exc})") from None
    tok.save_pretrained(str(out))
    gen: dict[str, Any] = {}
    for key, name in (("tokenizer.ggml.bos_token_id", "bos_token_id"),
                      ("tokenizer.ggml.eos_token_id", "eos_token_id"),
                      ("tokenizer.ggml.padding_token_id", "pad_token_id")):
        value = field(reader, key)
        if isinstance(value, int):
            gen[name] = value
    eos = _end_of_turn_ids(tok, gen.get("eos_token_id"))
    if eos:
        gen["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    (out / "gguf_source.json").write_text(json.dumps({
        "file": str(path), "architecture": info.architecture, "name": info.name,
        "tensor_types": info.tensor_types, "transformers": transformers.__version__,
        "converter_version": CONVERTER_VERSION}, indent=2))


def _phi3_fields(reader: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """Phi-3's LongRoPE, partial rotary and window, which transformers' GGUF table leaves
    out: llama.cpp stores the factors as the ``rope_factors_long`` / ``_short`` tensors,
    the original length and attention factor as ``phi3.rope.scaling.*`` keys."""
    out: dict[str, Any] = {}
    head = int(raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"])
    dims = field(reader, "phi3.rope.dimension_count")
    if isinstance(dims, int) and 0 < dims < head:
        out["partial_rotary_factor"] = dims / head
    window = field(reader, "phi3.attention.sliding_window")
    out["sliding_window"] = int(window) if window else None
    factors = {t.name: [float(x) for x in np.asarray(t.data).reshape(-1)]
               for t in reader.tensors if t.name.startswith("rope_factors_")}
    long, short = factors.get("rope_factors_long.weight"), factors.get("rope_factors_short.weight")
    if long is None or short is None:
        return out
    theta = (raw.get("rope_parameters") or {}).get("rope_theta", raw.get("rope_theta", 1e4))
    scaling: dict[str, Any] = {"rope_type": "longrope", "long_factor": long,
                               "short_factor": short, "rope_theta": theta}
    if "partial_rotary_factor" in out:
        scaling["partial_rotary_factor"] = out["partial_rotary_factor"]
    original = field(reader, "phi3.rope.scaling.original_context_length")
    if original:
        out["original_max_position_embeddings"] = int(original)
        scaling["original_max_position_embeddings"] = int(original)
    attn = field(reader, "phi3.rope.scaling.attn_factor")
    if attn:
        scaling["attention_factor"] = float(attn)
    out["rope_scaling"] = out["rope_parameters"] = scaling
    return out


#: Layers of the Gemma 27B models, whose query scale is hidden / heads in llama.cpp.
_GEMMA_27B_LAYERS = {"gemma3": 62, "gemma2": 46}


def _rope_freqs(reader: Any) -> dict[str, Any]:
    """Llama 3.1/3.2's scaling as llama.cpp's converter writes it: no config keys, but a
    ``rope_freqs`` tensor of one divisor per frequency (the ``llama3`` bands evaluated:
    1 for the high frequencies, ``factor`` for the low ones, the blend between), which
    ggml applies as ``theta / freq_factor``. That is LongRoPE's arithmetic with the same
    divisors for short and long contexts and no attention factor, so the config says
    exactly that (the values are the file's float32 divisors, the frequencies the
    safetensors' ``llama3`` scaling gives to float32 rounding)."""
    factors = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if factors is None:
        return {}
    divisors = [float(x) for x in np.asarray(factors.data, dtype=np.float32).reshape(-1)]
    return {"rope_type": "longrope", "short_factor": divisors, "long_factor": divisors,
            "attention_factor": 1.0}


def _rope_scaling(reader: Any, arch: str) -> dict[str, Any]:
    """``rope_scaling`` from llama.cpp's ``<arch>.rope.scaling.*`` keys: ``linear``
    (``factor``) and ``yarn`` (``factor``, ``original_context_length``, the betas when
    written); ``none`` or no key: {}. Other types are refused, naming the type."""
    kind = field(reader, f"{arch}.rope.scaling.type")
    if kind in (None, "", "none"):
        return {}
    factor = field(reader, f"{arch}.rope.scaling.factor")
    if kind not in ("linear", "yarn") or not factor:
        raise ModelLoadError(f"GGUF rope scaling {kind!r} (factor {factor}) is not supported "
                             "(supported: linear, yarn with a factor)")
    out: dict[str, Any] = {"rope_type": kind, "factor": float(factor)}
    if kind == "yarn":
        original = field(reader, f"{arch}.rope.scaling.original_context_length")
        if original:
            out["original_max_position_embeddings"] = int(original)
        for key in ("beta_fast", "beta_slow"):
            value = field(reader, f"{arch}.rope.scaling.yarn_{key}")
            if value:
                out[key] = float(value)
    return out


#: Whether the router renormalizes its top-k weights, when the file does not say
#: (``<arch>.expert_weights_norm``): as llama.cpp runs each architecture.
_NORM_TOPK = {"qwen3moe": True, "qwen2moe": False, "llama": True}


def _moe_fields(reader: Any, info: GGUFInfo) -> dict[str, Any]:
    """The mixture-of-experts config keys transformers' GGUF table leaves out (the
    experts' width, the shared expert's, Mixtral's experts under ``llama``)."""
    arch = info.architecture
    experts = int(field(reader, f"{arch}.expert_count", 0) or 0)
    if experts <= 0:
        return {}
    out: dict[str, Any] = {
        "num_local_experts" if arch == "llama" else "num_experts": experts,
        "num_experts_per_tok": int(field(reader, f"{arch}.expert_used_count")),
    }
    width = field(reader, f"{arch}.expert_feed_forward_length")
    if isinstance(width, int) and width > 0:
        out["moe_intermediate_size"] = width
        if arch == "llama":
            out["intermediate_size"] = width
    shared = field(reader, f"{arch}.expert_shared_feed_forward_length")
    if isinstance(shared, int) and shared > 0:
        out["shared_expert_intermediate_size"] = shared
    # Which layers have experts is the file's: a block without a router is dense.
    blocks = int(field(reader, f"{arch}.block_count", 0) or 0)
    routed = {int(t.name.split(".")[1]) for t in reader.tensors
              if t.name.startswith("blk.") and t.name.endswith(".ffn_gate_inp.weight")}
    out["decoder_sparse_step"] = 1
    out["mlp_only_layers"] = [i for i in range(blocks) if i not in routed]
    norm = field(reader, f"{arch}.expert_weights_norm")
    out["norm_topk_prob"] = bool(norm) if norm is not None else _NORM_TOPK.get(arch, False)
    if arch == "llama":
        out["model_type"] = "mixtral"
    return out


def _end_of_turn_ids(tok: Any, eos: int | None) -> list[int]:
    """The file's EOS plus the chat template's end-of-turn token when it differs.

    Instruct GGUFs often name ``<|endoftext|>`` as EOS while their chat template ends
    every turn with ``<|im_end|>`` or ``<end_of_turn>``; without the latter a chat
    reply would run on into a made-up next turn.
    """
    ids = [eos] if isinstance(eos, int) else []
    template = getattr(tok, "chat_template", None) or ""
    for marker in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>"):
        if marker in template:
            tid = tok.convert_tokens_to_ids(marker)
            if isinstance(tid, int) and tid >= 0 and tid != tok.unk_token_id and tid not in ids:
                ids.append(tid)
    return ids
