"""OPT: learned positions (offset 2), LayerNorm, ReLU MLP, tied LM head."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from glowlm.attention.backend import AttentionMetadata
from glowlm.distributed.parallel import PPMissingLayer, own_layers
from glowlm.errors import ModelLoadError
from glowlm.layers.activation import ACTIVATION_OPS, Activation
from glowlm.layers.attention import Attention
from glowlm.layers.context import ModelParts
from glowlm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from glowlm.layers.fused import FusedLayer, FusedStack
from glowlm.layers.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from glowlm.layers.norm import LayerNorm
from glowlm.models.base import CausalLM, prune_rows, run_layers
from glowlm.ops.fused import LnDecoderWeights

POSITION_OFFSET = 2  # OPT reserves the first two rows of its position table


class OPTDecoderLayer(nn.Module):
    def __init__(self, config: Any, index: int, parts: ModelParts, prefix: str) -> None:
        super().__init__()
        h, heads = config.hidden_size, config.num_attention_heads
        self.head_size = h // heads
        self.pre_norm = config.do_layer_norm_before
        bias = getattr(config, "enable_bias", True)
        self.qkv_proj = QKVParallelLinear(h, self.head_size, heads, heads, bias, parts,
                                          f"{prefix}.self_attn.qkv_proj")
        self.out_proj = RowParallelLinear(h, h, bias, parts, f"{prefix}.self_attn.out_proj")
        self.attn = Attention(heads, heads, self.head_size, self.head_size ** -0.5, index, parts)
        ln_affine = getattr(config, "layer_norm_elementwise_affine", True)
        if not ln_affine:
            raise ModelLoadError("OPT with layer_norm_elementwise_affine=False is not supported")
        self.self_attn_layer_norm = LayerNorm(h, 1e-5, parts)
        self.fc1 = ColumnParallelLinear(h, [config.ffn_dim], bias, parts, f"{prefix}.fc1")
        self.fc2 = RowParallelLinear(config.ffn_dim, h, bias, parts, f"{prefix}.fc2")
        self.act = Activation(config.activation_function, parts)
        self.final_layer_norm = LayerNorm(h, 1e-5, parts)
        self.activation = config.activation_function
        self.fused = FusedLayer(parts.ops.ln_decoder_layer, parts,
                                self.pre_norm and self.activation in ACTIVATION_OPS,
                                self._fused_weights)

    def _fused_weights(self) -> LnDecoderWeights:
        return LnDecoderWeights(
            self.self_attn_layer_norm.weight, self.self_attn_layer_norm.bias,
            self.qkv_proj.weight, self.qkv_proj.bias, self.out_proj.weight, self.out_proj.bias,
            self.final_layer_norm.weight, self.final_layer_norm.bias, self.fc1.weight,
            self.fc1.bias, self.fc2.weight, self.fc2.bias, self.final_layer_norm.eps,
            ACTIVATION_OPS[self.activation], tp_group=self.fused.tp_group)

    def forward(self, x: torch.Tensor, kv_caches: list[torch.Tensor],
                metadata: AttentionMetadata, keep: torch.Tensor | None = None) -> torch.Tensor:
        """``keep``: the token rows to carry past attention (see CausalLM.forward)."""
        if self.fused.runs and keep is None:
            out = self.fused.fn(x, self.fused.weights(), kv_caches[self.attn.layer_index],
                                metadata, self.attn.spec)
            if out is not None:
                return out
        residual = x
        if self.pre_norm:
            x = self.self_attn_layer_norm(x)
        q, k, v = self.qkv_proj(x).chunk(3, dim=-1)
        x = residual + self.out_proj(self.attn(q, k, v, kv_caches, metadata))
        (x,) = prune_rows(keep, x)
        if not self.pre_norm:
            x = self.self_attn_layer_norm(x)
        residual = x
        if self.pre_norm:
            x = self.final_layer_norm(x)
        x = residual + self.fc2(self.act(self.fc1(x)))
        if not self.pre_norm:
            x = self.final_layer_norm(x)
        return x


class OPTForCausalLM(CausalLM):
    stacked_params = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"),
                      ("qkv_proj", "v_proj", "v")]

    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__()
        h = config.hidden_size
        proj = config.word_embed_proj_dim
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, proj, parts,
                                                   "model.decoder.embed_tokens")
        self.embed_positions = nn.Embedding(config.max_position_embeddings + POSITION_OFFSET, h,
                                            dtype=parts.dtype)
        self.embed_positions.weight.requires_grad_(False)
        self.project_in = self.project_out = None
        if proj != h:
            self.project_in = ReplicatedLinear(proj, h, False, parts, "model.decoder.project_in")
            self.project_out = ReplicatedLinear(h, proj, False, parts,
                                                "model.decoder.project_out")
        self.final_layer_norm = None
        if config.do_layer_norm_before and not getattr(config, "_remove_final_layer_norm",
                                                       False):
            self.final_layer_norm = LayerNorm(h, 1e-5, parts)
        self.parallel = parts.parallel
        self.layers = own_layers(
            lambda i: OPTDecoderLayer(config, i, parts, f"model.decoder.layers.{i}"),
            config.num_hidden_layers, parts.parallel)
        self.own = [la for la in self.layers if not isinstance(la, PPMissingLayer)]
        self.stack = FusedStack(parts.ops.ln_decoder_stack, [la.fused for la in self.own],
                                [la.attn for la in self.own])
        self.lm_head = ParallelLMHead(config.vocab_size, proj, parts, "lm_head")
        self.lm_head.tie(self.embed_tokens)
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = self.own[0].attn.spec.num_kv_heads
        self.head_size = self.own[0].head_size
        self.kv_layers = [la.attn.layer_index for la in self.own]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                output_rows: torch.Tensor | None = None,
                intermediate: dict[str, torch.Tensor] | None = None
                ) -> torch.Tensor | dict[str, torch.Tensor]:
        """``intermediate``: the previous pipeline stage's hidden state; a stage other
        than the last returns its own as ``{"hidden": x}``."""
        if intermediate is None:
            x = self.embed_tokens(input_ids)
            if self.project_in is not None:
                x = self.project_in(x)
            x = x + self.embed_positions(positions + POSITION_OFFSET)
        else:
            x = intermediate["hidden"]
        last = self.parallel.is_last_stage
        x = run_layers(self.stack, self.own, x, kv_caches, metadata,
                       output_rows if last else None)
        if not last:
            return {"hidden": x}
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def rename(self, name: str) -> str | None:
        if name == "lm_head.weight":
            return None  # tied to the token embedding
        if name.startswith("decoder."):  # original facebook/opt checkpoints lack "model."
            name = "model." + name
        name = name.replace("model.decoder.embed_positions", "embed_positions")
        name = name.replace("model.decoder.final_layer_norm", "final_layer_norm")
        name = name.replace("model.decoder.project_", "project_")
        name = name.replace("model.decoder.embed_tokens", "embed_tokens")
        name = name.replace("model.decoder.layers.", "layers.")
        return name.replace(".self_attn.q_proj", ".q_proj").replace(
            ".self_attn.k_proj", ".k_proj").replace(".self_attn.v_proj", ".v_proj").replace(
            ".self_attn.out_proj", ".out_proj")
