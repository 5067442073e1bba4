"""Llama and its close relatives: Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm).

They differ only in switches read from the config, so one implementation with
those switches keeps the four in step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from glowlm.attention.backend import AttentionMetadata
from glowlm.distributed.parallel import PPMissingLayer, own_layers
from glowlm.layers.activation import SiluAndMul
from glowlm.layers.attention import Attention
from glowlm.layers.context import ModelParts
from glowlm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from glowlm.layers.fused import FusedLayer, FusedStack, projection_weights
from glowlm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from glowlm.layers.norm import RMSNorm
from glowlm.layers.rotary import RotaryEmbedding, rope_settings
from glowlm.models.base import CausalLM, prune_rows
from glowlm.ops.fused import RmsDecoderWeights


class LlamaAttention(nn.Module):
    def __init__(self, config: Any, index: int, parts: ModelParts, prefix: str,
                 qkv_bias: bool, qk_norm: bool, o_bias: bool) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_size = getattr(config, "head_dim", None) or hidden // self.num_heads
        tp = parts.parallel.tp_size
        self.q_size = self.num_heads * self.head_size // tp
        self.kv_size = max(1, self.num_kv_heads // tp) * self.head_size
        self.qkv_proj = QKVParallelLinear(hidden, self.head_size, self.num_heads,
                                          self.num_kv_heads, qkv_bias, parts, f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(self.num_heads * self.head_size, hidden,
                                        o_bias, parts, f"{prefix}.o_proj")
        theta, scaling = rope_settings(config)
        self.rotary = RotaryEmbedding(self.head_size, self.head_size,
                                      config.max_position_embeddings, theta, True, scaling, parts)
        self.q_norm = self.k_norm = None
        if qk_norm:
            self.q_norm = RMSNorm(self.head_size, config.rms_norm_eps, parts)
            self.k_norm = RMSNorm(self.head_size, config.rms_norm_eps, parts)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_size,
                              self.head_size ** -0.5, index, parts)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_caches: list[torch.Tensor],
                metadata: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(q.shape[0], -1, self.head_size)
        k = k.reshape(k.shape[0], -1, self.head_size)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        return self.o_proj(self.attn(q, k, v, kv_caches, metadata))


class LlamaMLP(nn.Module):
    def __init__(self, config: Any, parts: ModelParts, prefix: str) -> None:
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [inter, inter], getattr(config, "mlp_bias", False), parts,
            f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(inter, config.hidden_size,
                                           getattr(config, "mlp_bias", False), parts,
                                           f"{prefix}.down_proj")
        if getattr(config, "hidden_act", "silu") != "silu":
            from glowlm.errors import ModelLoadError

            raise ModelLoadError(f"hidden_act {config.hidden_act!r} is not supported for this "
                                 "architecture (supported: silu)")
        self.act = SiluAndMul(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: Any, index: int, parts: ModelParts, prefix: str,
                 qkv_bias: bool, qk_norm: bool, o_bias: bool) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, index, parts, f"{prefix}.self_attn", qkv_bias,
                                        qk_norm, o_bias)
        self.mlp = LlamaMLP(config, parts, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, parts)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, parts)
        self.fused = FusedLayer(parts.ops.rms_decoder_layer, parts, True, self._fused_weights)

    def _fused_weights(self) -> RmsDecoderWeights:
        a, m = self.self_attn, self.mlp
        projs = (a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj)
        (qkv_w, o_w, gate_up_w, down_w), quant = projection_weights(projs)
        return RmsDecoderWeights(
            self.input_layernorm.weight, qkv_w, a.qkv_proj.bias,
            a.q_norm.weight if a.q_norm is not None else None,
            a.k_norm.weight if a.k_norm is not None else None,
            a.rotary.cos_sin_cache, a.rotary.rotary_dim, a.rotary.is_neox, o_w,
            a.o_proj.bias, self.post_attention_layernorm.weight, gate_up_w,
            m.gate_up_proj.bias, down_w, m.down_proj.bias, self.input_layernorm.eps,
            quant=quant,
            tp_group=self.fused.tp_group)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``keep``: the token rows to carry past attention (see CausalLM.forward)."""
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
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, config: Any, parts: ModelParts, qkv_bias: bool, qk_norm: bool,
                 o_bias: bool) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, parts,
                                                   "model.embed_tokens")
        self.parallel = parts.parallel
        self.layers = own_layers(
            lambda i: LlamaDecoderLayer(config, i, parts, f"model.layers.{i}", qkv_bias,
                                        qk_norm, o_bias),
            config.num_hidden_layers, parts.parallel)
        # This pipeline stage's layers (all of them without PP).
        self.own = [la for la in self.layers if not isinstance(la, PPMissingLayer)]
        self.stack = FusedStack(parts.ops.rms_decoder_stack, [la.fused for la in self.own],
                                [la.self_attn.attn for la in self.own])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, parts)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                output_rows: torch.Tensor | None = None,
                intermediate: dict[str, torch.Tensor] | None = None
                ) -> torch.Tensor | dict[str, torch.Tensor]:
        """``intermediate``: the previous pipeline stage's hidden state and residual;
        a stage other than the last returns its own as that dict."""
        if intermediate is None:
            x = self.embed_tokens(input_ids)
            residual = None
        else:
            x, residual = intermediate["hidden"], intermediate["residual"]
        last = self.parallel.is_last_stage
        prune = output_rows is not None and last
        # The stack op starts from the embedding (no residual): later stages go by layer.
        out = None if residual is not None else self.stack(
            positions, x, None, kv_caches=kv_caches, metadata=metadata, skip_last=prune)
        if out is not None:
            x, residual = out
        else:
            for layer in self.own[:-1] if prune else self.own:
                x, residual = layer(positions, x, residual, kv_caches, metadata)
        if prune:
            x, residual = self.own[-1](positions, x, residual, kv_caches, metadata,
                                       output_rows)
        if not last:
            return {"hidden": x, "residual": residual}
        x, _ = self.norm(x, residual)
        return x


class LlamaForCausalLM(CausalLM):
    qkv_bias = False
    qk_norm = False
    stacked_params = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"),
                      ("qkv_proj", "v_proj", "v"), ("gate_up_proj", "gate_proj", 0),
                      ("gate_up_proj", "up_proj", 1)]

    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__()
        # Llama/Qwen3 `attention_bias` covers q, k, v and o; Qwen2 always has q, k, v
        # biases and never an o bias.
        config_bias = bool(getattr(config, "attention_bias", False))
        self.model = LlamaModel(config, parts, self.qkv_bias or config_bias, self.qk_norm,
                                config_bias and not self.qkv_bias)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, parts, "lm_head")
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        if self.tied:
            self.lm_head.tie(self.model.embed_tokens)
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
        return self.lm_head.compute_logits(hidden)

    def rename(self, name: str) -> str | None:
        if "rotary_emb" in name or (self.tied and name == "lm_head.weight"):
            return None
        return name


class MistralForCausalLM(LlamaForCausalLM):
    pass


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
