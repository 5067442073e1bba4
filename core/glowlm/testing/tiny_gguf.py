"""Write a tiny Hugging Face checkpoint as a GGUF file, laid out as llama.cpp's converter
lays it out, so the GGUF loader is tested on every architecture it reads.

The writer does what llama.cpp's ``convert_hf_to_gguf.py`` does to these
architectures: llama.cpp tensor names, Llama's q/k rows permuted for its rotary
layout, Gemma's norm weights stored as ``1 + w``, the config as ``<arch>.*`` keys
and the byte-level BPE vocabulary as ``tokenizer.ggml.*`` (``gpt2`` model). Tensors
are written as F32 (exact) or quantized to ``qtype`` (one type, or a function of the
GGUF tensor name: mixed files as llama.cpp's ``Q4_K_M`` writes them) with the ``gguf``
package, or :mod:`glowlm.testing.gguf_blocks` for the K-quants it cannot write.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: HF model_type -> GGUF general.architecture.
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "gemma3_text": "gemma3", "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe",
             "mixtral": "llama", "gemma2": "gemma2", "starcoder2": "starcoder2",
             "phi3": "phi3"}
_LAYER = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp", "block_sparse_moe.gate": "ffn_gate_inp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
}
#: One expert's projection (HF names) -> llama.cpp's stacked ``[experts, out, in]`` tensor.
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\."
                     r"(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")
_EXPERT_GGUF = {"gate_proj": "ffn_gate_exps", "w1": "ffn_gate_exps", "up_proj": "ffn_up_exps",
                "w3": "ffn_up_exps", "down_proj": "ffn_down_exps", "w2": "ffn_down_exps"}
_GEMMA_LAYER = {**_LAYER, "post_attention_layernorm": "post_attention_norm",
                "pre_feedforward_layernorm": "ffn_norm",
                "post_feedforward_layernorm": "post_ffw_norm"}

_STARCODER2_LAYER = {**_LAYER, "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
_PHI3_LAYER = {**_LAYER, "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}
_TABLES = {"gemma3": _GEMMA_LAYER, "gemma2": _GEMMA_LAYER, "starcoder2": _STARCODER2_LAYER,
           "phi3": _PHI3_LAYER}


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).transpose(1, 2) \
        .reshape(w.shape)


def _gguf_name(arch: str, name: str) -> str | None:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name in ("model.norm.weight", "model.norm.bias"):
        return f"output_norm.{name.rsplit('.', 1)[1]}"
    if name == "lm_head.weight":
        return "output.weight"
    parts = name.split(".")
    if parts[:2] != ["model", "layers"]:
        return None
    layer, rest = parts[2], ".".join(parts[3:])
    stem, _, suffix = rest.rpartition(".")
    table = _TABLES.get(arch, _LAYER)
    return f"blk.{layer}.{table[stem]}.{suffix}" if stem in table else None


def _llama3_divisors(rope: dict[str, Any], head_dim: int, theta: float) -> np.ndarray:
    """The ``rope_freqs`` tensor llama.cpp's converter writes for ``llama3`` scaling:
    per frequency 1 (short wavelengths), ``factor`` (long ones) or the blend's divisor."""
    import math

    factor, low = float(rope["factor"]), float(rope.get("low_freq_factor", 1.0))
    high = float(rope.get("high_freq_factor", 4.0))
    old = float(rope["original_max_position_embeddings"])
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def write_tiny_gguf(model_dir: str | Path, out: str | Path,
                    qtype: str | Callable[[str], str] = "F32") -> Path:
    """``model_dir`` (a tiny_models checkpoint) -> a GGUF file at ``out``; matrices in
    ``qtype`` (or ``qtype(gguf_name)``), vectors F32."""
    import gguf
    from safetensors.torch import load_file

    from glowlm.testing.gguf_blocks import quantize

    model_dir, out = Path(model_dir), Path(out)
    cfg: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    arch = GGUF_ARCH[cfg["model_type"]]
    w = gguf.GGUFWriter(str(out), arch)
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or \
        cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_name(model_dir.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    if arch == "starcoder2":
        w.add_layer_norm_eps(cfg["norm_epsilon"])
    else:
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0
    if arch in ("gemma3", "gemma2"):
        theta = (rope.get("full_attention") or {}).get("rope_theta", theta)
        w.add_sliding_window(cfg["sliding_window"])
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        if arch == "gemma2":
            w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    elif arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    elif arch == "phi3":  # llama.cpp's: LongRoPE factors as tensors, the rest as keys
        w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
        if cfg.get("sliding_window"):
            w.add_sliding_window(cfg["sliding_window"])
        if rope.get("rope_type") == "longrope":
            w.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
            for which in ("long", "short"):
                w.add_tensor(f"rope_factors_{which}.weight",
                             np.asarray(rope[f"{which}_factor"], dtype=np.float32))
    else:
        w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(theta))
    kind = rope.get("rope_type", "default") if "rope_theta" in rope else "default"
    if kind == "llama3":  # llama.cpp's converter: one divisor per frequency, as a tensor
        w.add_tensor("rope_freqs.weight", _llama3_divisors(rope, head_dim, float(theta)))
    if kind in ("linear", "yarn"):  # as llama.cpp's converter writes them
        w.add_rope_scaling_type(gguf.RopeScalingType(kind))
        w.add_rope_scaling_factor(float(rope["factor"]))
        if kind == "yarn":
            w.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg.get("moe_intermediate_size")
                                         or cfg["intermediate_size"])
        if cfg.get("shared_expert_intermediate_size"):
            w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
        if arch in ("qwen3moe", "qwen2moe"):
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
    _add_tokenizer(w, model_dir, cfg["vocab_size"])
    state = _stack_experts(load_file(model_dir / "model.safetensors"))
    for name, t in state.items():
        gname = name if name.startswith("blk.") else _gguf_name(arch, name)
        if gname is None:
            continue
        t = t.float()
        if arch == "llama" and ".attn_q." in gname:
            t = _permute(t, heads)
        elif arch == "llama" and ".attn_k." in gname:
            t = _permute(t, kv)
        if arch in ("gemma3", "gemma2") and gname.endswith("norm.weight"):
            t = t + 1.0
        data = t.numpy()
        kind_name = qtype(gname) if callable(qtype) else qtype
        if gname.endswith("ffn_gate_inp_shexp.weight"):
            data = data.reshape(-1)  # llama.cpp writes the [1, hidden] gate as a vector
        if kind_name != "F32" and data.ndim in (2, 3):
            # Stacked experts [experts, out, in]: every row quantized, then restacked.
            kind = gguf.GGMLQuantizationType[kind_name]
            blocks = quantize(data.reshape(-1, data.shape[-1]), kind_name)
            w.add_tensor(gname, blocks.reshape(*data.shape[:-1], -1), raw_dtype=kind)
        else:
            w.add_tensor(gname, np.ascontiguousarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _stack_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert tensors stacked into llama.cpp's ``blk.N.ffn_{gate,up,down}_exps``
    (``[experts, out, in]``, expert order), the rest unchanged."""
    out: dict[str, torch.Tensor] = {}
    stacks: dict[str, dict[int, torch.Tensor]] = {}
    for name, t in state.items():
        m = _EXPERT.match(name)
        if m is None:
            out[name] = t
            continue
        stacks.setdefault(f"blk.{m[1]}.{_EXPERT_GGUF[m[3]]}.weight", {})[int(m[2])] = t
    for gname, per in stacks.items():
        out[gname] = torch.stack([per[e] for e in sorted(per)])
    return out


def _add_tokenizer(w: Any, model_dir: Path, vocab_size: int) -> None:
    """The BPE vocabulary, padded to the model's vocab size with ``[PAD<i>]`` entries
    of type UNUSED, as llama.cpp's converter pads a vocabulary smaller than the
    embedding matrix."""
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    specials = {a["content"]: a["id"] for a in tok.get("added_tokens", [])}
    size = max(vocab_size, max([*vocab.values(), *specials.values()]) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [5] * size
    for text, i in {**vocab, **specials}.items():
        tokens[i] = text
        types[i] = 3 if text in specials else 1
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(specials.get("<s>", 0))
    w.add_eos_token_id(specials.get("</s>", 1))
    w.add_add_bos_token(False)
