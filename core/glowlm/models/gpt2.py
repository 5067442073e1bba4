"""GPT-2: learned positions, LayerNorm, GELU (tanh), Conv1D weights stored transposed."""

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
from glowlm.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from glowlm.layers.norm import LayerNorm
from glowlm.models.base import CausalLM, prune_rows, run_layers
from glowlm.ops.fused import LnDecoderWeights

_CONV1D = ("c_attn.weight", "c_proj.weight", "c_fc.weight")


class GPT2Block(nn.Module):
    def __init__(self, config: Any, index: int, parts: ModelParts, prefix: str) -> None:
        super().__init__()
        h, heads = config.n_embd, config.n_head
        self.head_size = h // heads
        inner = config.n_inner or 4 * h
        eps = config.layer_norm_epsilon
        if getattr(config, "scale_attn_by_inverse_layer_idx", False) or getattr(
                config, "reorder_and_upcast_attn", False):
            raise ModelLoadError("GPT-2 variants with scale_attn_by_inverse_layer_idx or "
                                 "reorder_and_upcast_attn are not supported")
        scale = self.head_size ** -0.5 if getattr(config, "scale_attn_weights", True) else 1.0
        self.ln_1 = LayerNorm(h, eps, parts)
        self.c_attn = QKVParallelLinear(h, self.head_size, heads, heads, True, parts,
                                        f"{prefix}.attn.c_attn")
        self.c_proj = RowParallelLinear(h, h, True, parts, f"{prefix}.attn.c_proj")
        self.attn = Attention(heads, heads, self.head_size, scale, index, parts)
        self.ln_2 = LayerNorm(h, eps, parts)
        self.c_fc = ColumnParallelLinear(h, [inner], True, parts, f"{prefix}.mlp.c_fc")
        self.mlp_proj = RowParallelLinear(inner, h, True, parts, f"{prefix}.mlp.c_proj")
        self.act = Activation(config.activation_function, parts)
        self.activation = config.activation_function
        self.fused = FusedLayer(parts.ops.ln_decoder_layer, parts,
                                self.activation in ACTIVATION_OPS, self._fused_weights)

    def _fused_weights(self) -> LnDecoderWeights:
        return LnDecoderWeights(
            self.ln_1.weight, self.ln_1.bias, self.c_attn.weight, self.c_attn.bias,
            self.c_proj.weight, self.c_proj.bias, self.ln_2.weight, self.ln_2.bias,
            self.c_fc.weight, self.c_fc.bias, self.mlp_proj.weight, self.mlp_proj.bias,
            self.ln_2.eps, ACTIVATION_OPS[self.activation], tp_group=self.fused.tp_group)

    def forward(self, x: torch.Tensor, kv_caches: list[torch.Tensor],
                metadata: AttentionMetadata, keep: torch.Tensor | None = None) -> torch.Tensor:
        """``keep``: the token rows to carry past attention (see CausalLM.forward)."""
        if self.fused.runs and keep is None:
            out = self.fused.fn(x, self.fused.weights(), kv_caches[self.attn.layer_index],
                                metadata, self.attn.spec)
            if out is not None:
                return out
        q, k, v = self.c_attn(self.ln_1(x)).chunk(3, dim=-1)
        x = x + self.c_proj(self.attn(q, k, v, kv_caches, metadata))
        (x,) = prune_rows(keep, x)
        return x + self.mlp_proj(self.act(self.c_fc(self.ln_2(x))))


class GPT2LMHeadModel(CausalLM):
    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__()
        h = config.n_embd
        self.wte = VocabParallelEmbedding(config.vocab_size, h, parts, "transformer.wte")
        self.wpe = nn.Embedding(config.n_positions, h, dtype=parts.dtype)
        self.wpe.weight.requires_grad_(False)
        self.parallel = parts.parallel
        self.h = own_layers(lambda i: GPT2Block(config, i, parts, f"transformer.h.{i}"),
                            config.n_layer, parts.parallel)
        self.own = [b for b in self.h if not isinstance(b, PPMissingLayer)]
        self.stack = FusedStack(parts.ops.ln_decoder_stack, [b.fused for b in self.own],
                                [b.attn for b in self.own])
        self.ln_f = LayerNorm(h, config.layer_norm_epsilon, parts)
        self.lm_head = ParallelLMHead(config.vocab_size, h, parts, "lm_head")
        self.lm_head.tie(self.wte)
        self.num_layers = config.n_layer
        self.num_kv_heads = self.own[0].attn.spec.num_kv_heads
        self.head_size = self.own[0].head_size
        self.kv_layers = [b.attn.layer_index for b in self.own]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                output_rows: torch.Tensor | None = None,
                intermediate: dict[str, torch.Tensor] | None = None
                ) -> torch.Tensor | dict[str, torch.Tensor]:
        """``intermediate``: the previous pipeline stage's hidden state; a stage other
        than the last returns its own as ``{"hidden": x}``."""
        last = self.parallel.is_last_stage
        x = (self.wte(input_ids) + self.wpe(positions) if intermediate is None
             else intermediate["hidden"])
        x = run_layers(self.stack, self.own, x, kv_caches, metadata,
                       output_rows if last else None)
        return self.ln_f(x) if last else {"hidden": x}

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def rename(self, name: str) -> str | None:
        if name == "lm_head.weight" or name.endswith((".attn.bias", ".attn.masked_bias")):
            return None
        name = name.removeprefix("transformer.")
        return name.replace(".attn.c_attn", ".c_attn").replace(".attn.c_proj", ".c_proj") \
            .replace(".mlp.c_fc", ".c_fc").replace(".mlp.c_proj", ".mlp_proj")

    def load_weights(self, weights, progress=None, loaded=None):  # type: ignore[override]
        # HF GPT-2 stores linear weights as Conv1D ([in, out]); ours are [out, in].
        def transposed(name: str, load):  # noqa: ANN001
            if name.endswith(_CONV1D):
                return lambda: load().t()
            return load

        return super().load_weights(((n, transposed(n, ld)) for n, ld in weights), progress,
                                    loaded)
