"""Gemma 3, text only (``Gemma3ForCausalLM``): transformers' ``modeling_gemma3`` on paged KV.

What sets it apart from the Llama family, and where each part lives:

- RMSNorm is ``x / rms(x) * (1 + w)`` in float32 (:class:`~glowlm.layers.norm.GemmaRMSNorm`
  keeps ``1 + w`` in float32, so the platform's plain ``rms_norm`` op computes it);
  four norms per layer: before and after attention, before and after the MLP, the
  "after" ones applied to the branch before it joins the residual.
- q and k are RMS-normed over ``head_dim`` before rotary; the attention scale is
  ``query_pre_attn_scalar ** -0.5``, not ``head_dim ** -0.5``.
- Embeddings are multiplied by ``sqrt(hidden_size)`` rounded to the model dtype, as
  transformers does (bf16 turns sqrt(640) = 25.30 into 25.25).
- The MLP is GeGLU with the tanh GELU (``gelu_tanh_and_mul``).
- Layers are local (sliding window, ``rope_local_base_freq``, no scaling) or global
  (full attention, ``rope_theta`` and ``rope_scaling``), from ``config.layer_types``
  or every ``sliding_window_pattern``-th layer global; the window goes to the
  attention backend in the layer's spec.
- ``final_logit_softcapping``, when the config sets it, caps the logits
  (``cap * tanh(logits / cap)``), as transformers does. ``attn_logit_softcapping`` is
  read by transformers' Gemma 3 but never applied (its attention call passes no
  ``softcap``; Gemma 3 replaced Gemma 2's attention soft-cap by the q/k norms), and
  vLLM's Gemma 3 passes none either, so a config that sets it gets a warning and the
  same attention as transformers; both are unset in Google's Gemma 3 configs.
- Embeddings are tied to the LM head.

Each layer also describes itself as :class:`~glowlm.ops.fused.DecoderLayerWeights`
(the branch norms as ``post_norm1/2``, its rotary table, its window, its quantized
projections), and the model runs every layer in one platform call when the platform
offers a ``decoder_stack`` that takes them (x86: ``gemma_decoder_stack``), layer by
layer with its ``decoder_layer`` when the stack declines a step, and its modules
otherwise; the modules define the result and the fused ops match them bit for bit. At
decode that removes about a dozen Python ops per layer, each slow right after a GEMV
has streamed the layer's weights. Gemma's layers fit neither the LayerNorm nor the
Llama form (``as_ln`` / ``as_rms``), so only a platform's own decoder ops run them. An
op honours each layer's window (x86's attends it in its paged attention kernel) or
declines the steps it would hide keys in; tensor parallelism keeps the modules
(FusedLayer).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from glowlm.attention.backend import AttentionMetadata
from glowlm.distributed.parallel import PPMissingLayer, own_layers
from glowlm.errors import ModelLoadError
from glowlm.layers.activation import GatedActivation
from glowlm.layers.attention import Attention
from glowlm.layers.context import ModelParts
from glowlm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from glowlm.layers.fused import FusedLayer, FusedStack, projection_weights
from glowlm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from glowlm.layers.norm import GemmaRMSNorm
from glowlm.layers.rotary import RotaryEmbedding
from glowlm.logger import init_logger
from glowlm.models.base import CausalLM, prune_rows
from glowlm.ops.fused import DecoderLayerWeights, Rotary

logger = init_logger(__name__)

SLIDING, FULL = "sliding_attention", "full_attention"


def layer_types(config: Any) -> list[str]:
    """``sliding_attention`` / ``full_attention`` per layer: ``config.layer_types``, or
    the older ``sliding_window_pattern`` (every n-th layer global, the rest local)."""
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if not types:
        pattern = int(getattr(config, "sliding_window_pattern", None)
                      or getattr(config, "_sliding_window_pattern", None) or 6)
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
    types = list(types)
    if len(types) != n or not set(types) <= {SLIDING, FULL}:
        raise ModelLoadError(f"config layer_types must list {n} of {SLIDING!r} / {FULL!r}, "
                             f"got {types!r}")
    return types


def rope_for(config: Any, layer_type: str) -> tuple[float, dict[str, Any] | None]:
    """``(theta, scaling)`` of one layer type, from transformers 5's per-type
    ``rope_parameters`` or the older ``rope_local_base_freq`` / ``rope_theta`` +
    ``rope_scaling`` (local layers are never scaled)."""
    rope = getattr(config, "rope_parameters", None) or {}
    params = rope.get(layer_type)
    flat = rope if "rope_theta" in rope else {}  # one set for every layer: the global one
    if isinstance(params, dict) and params:
        theta, scaling = float(params["rope_theta"]), dict(params)
    elif layer_type == SLIDING:
        theta, scaling = float(getattr(config, "rope_local_base_freq", None) or 10000.0), None
    else:
        theta = float(flat.get("rope_theta") or getattr(config, "rope_theta", None)
                      or 1_000_000.0)
        scaling = getattr(config, "rope_scaling", None) or (dict(flat) if flat else None)
    if scaling is not None and scaling.get("rope_type", scaling.get("type", "default")) \
            == "default":
        scaling = None
    return theta, scaling


class Gemma3Attention(nn.Module):
    def __init__(self, config: Any, index: int, parts: ModelParts, prefix: str,
                 sliding: bool, rotary: RotaryEmbedding) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_size = getattr(config, "head_dim", None) or hidden // self.num_heads
        tp = parts.parallel.tp_size
        self.q_size = self.num_heads * self.head_size // tp
        self.kv_size = max(1, self.num_kv_heads // tp) * self.head_size
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(hidden, self.head_size, self.num_heads,
                                          self.num_kv_heads, bias, parts, f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(self.num_heads * self.head_size, hidden, bias, parts,
                                        f"{prefix}.o_proj")
        eps = config.rms_norm_eps
        self.q_norm = GemmaRMSNorm(self.head_size, eps, parts, f"{prefix}.q_norm")
        self.k_norm = GemmaRMSNorm(self.head_size, eps, parts, f"{prefix}.k_norm")
        self.rotary = rotary  # one table per layer type, shared by the layers of that type
        window = getattr(config, "sliding_window", None) if sliding else None
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_size,
                              float(config.query_pre_attn_scalar) ** -0.5, index, parts,
                              int(window) if window else None)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_caches: list[torch.Tensor],
                metadata: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(q.shape[0], -1, self.head_size))
        k = self.k_norm(k.reshape(k.shape[0], -1, self.head_size))
        q, k = self.rotary(positions, q, k)
        return self.o_proj(self.attn(q, k, v, kv_caches, metadata))


class Gemma3MLP(nn.Module):
    def __init__(self, config: Any, parts: ModelParts, prefix: str) -> None:
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter],
                                                       False, parts, f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(inter, config.hidden_size, False, parts,
                                           f"{prefix}.down_proj")
        act = (getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
               or "gelu_pytorch_tanh")
        self.act = GatedActivation(act, parts)
        #: the activation's name in DecoderLayerWeights
        self.activation = {"gelu_pytorch_tanh": "gelu_tanh"}.get(act, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: Any, index: int, parts: ModelParts, prefix: str,
                 sliding: bool, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = Gemma3Attention(config, index, parts, f"{prefix}.self_attn", sliding,
                                         rotary)
        self.mlp = Gemma3MLP(config, parts, f"{prefix}.mlp")
        h, eps = config.hidden_size, config.rms_norm_eps
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, GemmaRMSNorm(h, eps, parts, f"{prefix}.{name}"))
        self.fused = FusedLayer(parts.ops.decoder_layer, parts, True, self._fused_weights)

    def _fused_weights(self) -> DecoderLayerWeights:
        a, m = self.self_attn, self.mlp
        projs = (a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj)
        (qkv_w, o_w, up_w, down_w), quant = projection_weights(projs)
        return DecoderLayerWeights(
            norm="rms", norm1_weight=self.input_layernorm.weight, norm1_bias=None,
            qkv_weight=qkv_w, qkv_bias=a.qkv_proj.bias, o_weight=o_w, o_bias=a.o_proj.bias,
            norm2_weight=self.pre_feedforward_layernorm.weight, norm2_bias=None,
            mlp="gated", activation=m.activation, up_weight=up_w, up_bias=None,
            down_weight=down_w, down_bias=None, eps=self.input_layernorm.eps,
            rotary=Rotary(a.rotary.cos_sin_cache, a.rotary.rotary_dim, a.rotary.is_neox),
            q_norm_weight=a.q_norm.weight, k_norm_weight=a.k_norm.weight,
            post_norm1_weight=self.post_attention_layernorm.weight,
            post_norm2_weight=self.post_feedforward_layernorm.weight,
            sliding_window=a.attn.spec.sliding_window,
            quant=quant, tp_group=self.fused.tp_group)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(branch output, residual)``: the next norm adds them (``fused_add_rms_norm``
        rounds the sum to the model dtype, as transformers' ``residual + hidden`` does).
        ``keep``: the token rows to carry past attention (see CausalLM.forward)."""
        if self.fused.fn is not None and keep is None:
            attn = self.self_attn.attn
            out = self.fused.fn(positions, x, residual, self.fused.weights(),
                                kv_caches[attn.layer_index], metadata, attn.spec)
            if out is not None:
                return out
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, kv_caches, metadata)
        x, residual = prune_rows(keep, x, residual)
        x = self.post_attention_layernorm(x)
        x, residual = self.pre_feedforward_layernorm(x, residual)
        return self.post_feedforward_layernorm(self.mlp(x)), residual


class Gemma3Model(nn.Module):
    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__()
        if getattr(config, "use_bidirectional_attention", False):
            raise ModelLoadError("Gemma 3 with use_bidirectional_attention (an embedding "
                                 "model) is not a causal LM; glowlm serves causal Gemma 3 only")
        if getattr(config, "attn_logit_softcapping", None) is not None:
            logger.warning("config sets attn_logit_softcapping=%s; Gemma 3 does not apply it "
                           "(transformers' and vLLM's Gemma 3 neither)",
                           config.attn_logit_softcapping)
        h = config.hidden_size
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, h, parts,
                                                   "model.embed_tokens")
        self.register_buffer("embed_scale", torch.tensor(h ** 0.5, dtype=parts.dtype),
                             persistent=False)
        self.layer_types = layer_types(config)
        head = getattr(config, "head_dim", None) or h // config.num_attention_heads
        rotary = {}
        for kind in sorted(set(self.layer_types)):
            theta, scaling = rope_for(config, kind)
            rotary[kind] = RotaryEmbedding(head, head, config.max_position_embeddings, theta,
                                           True, scaling, parts)
        self.parallel = parts.parallel
        # A pipeline stage builds its own layers only (placeholders keep indices global).
        self.layers = own_layers(
            lambda i: Gemma3DecoderLayer(config, i, parts, f"model.layers.{i}",
                                         self.layer_types[i] == SLIDING,
                                         rotary[self.layer_types[i]]),
            config.num_hidden_layers, parts.parallel)
        self.own = [la for la in self.layers if not isinstance(la, PPMissingLayer)]
        # Local and global layers differ in their window only: it travels in each
        # layer's weights, so one call takes them all.
        self.stack = FusedStack(parts.ops.decoder_stack, [la.fused for la in self.own],
                                [la.self_attn.attn for la in self.own], per_layer_window=True)
        self.norm = GemmaRMSNorm(h, config.rms_norm_eps, parts, "model.norm")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                output_rows: torch.Tensor | None = None,
                intermediate: dict[str, torch.Tensor] | None = None
                ) -> torch.Tensor | dict[str, torch.Tensor]:
        """``intermediate``: the previous pipeline stage's hidden state and residual; a
        stage other than the last returns its own as that dict."""
        if intermediate is None:
            x = self.embed_tokens(input_ids) * self.embed_scale
            residual = None
        else:
            x, residual = intermediate["hidden"], intermediate["residual"]
        is_last = self.parallel.is_last_stage
        prune = output_rows is not None and is_last
        out = self.stack(positions, x, residual, kv_caches=kv_caches, metadata=metadata,
                         skip_last=prune)
        if out is not None:
            x, residual = out
        else:
            for layer in self.own[:-1] if prune else self.own:
                x, residual = layer(positions, x, residual, kv_caches, metadata)
        if prune:
            x, residual = self.own[-1](positions, x, residual, kv_caches, metadata,
                                       output_rows)
        if not is_last:
            return {"hidden": x, "residual": residual}
        x, _ = self.norm(x, residual)
        return x


class Gemma3ForCausalLM(CausalLM):
    stacked_params = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"),
                      ("qkv_proj", "v_proj", "v"), ("gate_up_proj", "gate_proj", 0),
                      ("gate_up_proj", "up_proj", 1)]
    #: Its local layers attend within ``config.sliding_window`` (the backend masks the
    #: rest), so the window does not bound the context (``resolve_max_model_len``).
    sliding_window_attention = True

    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__()
        self.model = Gemma3Model(config, parts)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, parts, "lm_head")
        self.tied = bool(getattr(config, "tie_word_embeddings", True))
        if self.tied:
            self.lm_head.tie(self.model.embed_tokens)
        cap = getattr(config, "final_logit_softcapping", None)
        self.final_softcap = float(cap) if cap else None
        attn = self.model.own[0].self_attn
        self.num_layers = config.num_hidden_layers
        self.kv_layers = [la.self_attn.attn.layer_index for la in self.model.own]
        self.num_kv_heads = attn.attn.spec.num_kv_heads
        self.head_size = attn.head_size

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                output_rows: torch.Tensor | None = None,
                intermediate: dict[str, torch.Tensor] | None = None
                ) -> torch.Tensor | dict[str, torch.Tensor]:
        return self.model(input_ids, positions, kv_caches, metadata, output_rows, intermediate)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head.compute_logits(hidden)
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    def rename(self, name: str) -> str | None:
        if "rotary_emb" in name or (self.tied and name == "lm_head.weight"):
            return None
        return name
