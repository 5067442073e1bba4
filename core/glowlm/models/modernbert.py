"""ModernBERT encoders: embedding models and cross-encoder classifiers.

ModernBERT (transformers' ``ModernBertModel`` / ``ModernBertForSequenceClassification``)
is a pre-LN encoder. It differs from BERT in four places, each a reason this module
exists apart from :mod:`glowlm.models.bert`:

- Positions are rotary (no position or token-type tables), with a different base per
  layer kind: ``rope_parameters["full_attention"]`` (160,000 by default) and
  ``["sliding_attention"]`` (10,000).
- Global and local layers alternate (``layer_types``, or every
  ``global_attn_every_n_layers``-th layer global). A local layer's token attends
  to tokens at most ``local_attention // 2`` positions away, on both sides.
- The MLP is gated: ``Wo(act(input) * gate)``, where ``input | gate`` is one ``Wi``
  projection.
- Norms may have no bias (``norm_bias``), the first layer has no attention norm,
  and a ``final_norm`` follows the last layer.

The classifier pools as the config says (``classifier_pooling``: the first token or
the mean of all tokens). It then runs ``head`` (``dense -> act -> norm``) and
``classifier``. The q/k/v and input/gate projections are stored fused in the
checkpoint (``Wqkv``, ``Wi``) and load as fused linears. The platform's linear
kernels therefore serve them as they serve every other projection.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from glowlm.errors import ModelLoadError
from glowlm.layers.activation import Activation
from glowlm.layers.context import ModelParts
from glowlm.layers.embedding import VocabParallelEmbedding
from glowlm.layers.encoder_attention import EncoderBatch, bidirectional_attention
from glowlm.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from glowlm.layers.norm import LayerNorm
from glowlm.layers.rotary import RotaryEmbedding
from glowlm.models.base import CausalLM
from glowlm.models.bert import BertModel, check_one_rank

_THETA = {"full_attention": ("global_rope_theta", 160_000.0),
          "sliding_attention": ("local_rope_theta", 10_000.0)}


def layer_types(config: Any) -> list[str]:
    """Each layer's kind, ``full_attention`` or ``sliding_attention``."""
    kinds = getattr(config, "layer_types", None)
    if kinds:
        return list(kinds)
    every = int(getattr(config, "global_attn_every_n_layers", 3) or 1)
    return ["sliding_attention" if i % every else "full_attention"
            for i in range(config.num_hidden_layers)]


def _rope(config: Any, kind: str) -> tuple[float, dict[str, Any] | None]:
    """``(theta, scaling)`` of one layer kind: transformers 5's per-kind
    ``rope_parameters``, else the older ``global_rope_theta`` / ``local_rope_theta``."""
    params = (getattr(config, "rope_parameters", None) or {}).get(kind) or {}
    name, default = _THETA[kind]
    theta = float(params.get("rope_theta") or getattr(config, name, None) or default)
    scaling = params if params.get("rope_type", "default") != "default" else None
    return theta, scaling


def _norm(config: Any, parts: ModelParts) -> LayerNorm:
    return LayerNorm(config.hidden_size, config.norm_eps, parts,
                     bias=bool(getattr(config, "norm_bias", False)))


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__()
        self.tok_embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size,
                                                     parts, "embeddings.tok_embeddings")
        self.norm = _norm(config, parts)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))


class _Attention(nn.Module):
    def __init__(self, config: Any, parts: ModelParts, prefix: str, kind: str,
                 rotary: RotaryEmbedding) -> None:
        super().__init__()
        h, heads = config.hidden_size, config.num_attention_heads
        if h % heads:
            raise ModelLoadError(f"hidden_size {h} is not a multiple of "
                                 f"num_attention_heads {heads}")
        bias = bool(getattr(config, "attention_bias", False))
        self.num_heads, self.head_size, self.hidden = heads, h // heads, h
        self.Wqkv = ColumnParallelLinear(h, [h, h, h], bias, parts, f"{prefix}.Wqkv")
        self.Wo = RowParallelLinear(h, h, bias, parts, f"{prefix}.Wo")
        self.rotary = rotary  # one table per layer kind, shared by its layers
        #: how far a token sees on each side (None: the whole sequence)
        self.window = (int(config.local_attention) // 2 if kind == "sliding_attention"
                       else None)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, batch: EncoderBatch
                ) -> torch.Tensor:
        h = self.hidden
        q, k, v = self.Wqkv(x).split([h, h, h], dim=-1)
        q, k = self.rotary(positions, q.reshape(q.shape[0], -1, self.head_size),
                           k.reshape(k.shape[0], -1, self.head_size))
        out = bidirectional_attention(q.reshape(-1, h), k.reshape(-1, h), v, batch,
                                      self.num_heads, self.head_size ** -0.5, self.window)
        return self.Wo(out)


class _MLP(nn.Module):
    def __init__(self, config: Any, parts: ModelParts, prefix: str) -> None:
        super().__init__()
        h, inter = config.hidden_size, int(config.intermediate_size)
        bias = bool(getattr(config, "mlp_bias", False))
        self.inter = inter
        self.Wi = ColumnParallelLinear(h, [inter, inter], bias, parts, f"{prefix}.Wi")
        self.act = Activation(getattr(config, "hidden_activation", "gelu"), parts)
        self.Wo = RowParallelLinear(inter, h, bias, parts, f"{prefix}.Wo")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up, gate = self.Wi(x).split([self.inter, self.inter], dim=-1)
        return self.Wo(self.act(up) * gate)


class ModernBertLayer(nn.Module):
    def __init__(self, config: Any, parts: ModelParts, index: int, kind: str,
                 rotary: RotaryEmbedding) -> None:
        super().__init__()
        prefix = f"layers.{index}"
        # transformers' first layer has no attention norm (the embeddings' norm precedes it)
        self.attn_norm = nn.Identity() if index == 0 else _norm(config, parts)
        self.attn = _Attention(config, parts, f"{prefix}.attn", kind, rotary)
        self.mlp_norm = _norm(config, parts)
        self.mlp = _MLP(config, parts, f"{prefix}.mlp")

    def forward(self, x: torch.Tensor, positions: torch.Tensor, batch: EncoderBatch
                ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), positions, batch)
        return x + self.mlp(self.mlp_norm(x))


class ModernBertModel(nn.Module):
    """The encoder: packed token ids -> hidden states of every token (after
    ``final_norm``). Parameter names are the base model's checkpoint names;
    :meth:`rename` strips the ``model.`` prefix that a task model's checkpoint adds."""

    is_pooling_model: ClassVar[bool] = True
    is_encoder: ClassVar[bool] = True
    default_pooling_type: ClassVar[str] = "CLS"
    default_task: ClassVar[str] = "embed"
    stacked_params: ClassVar[list[tuple[str, str, str]]] = []
    #: its local layers apply the window themselves (config.sliding_window is transformers'
    #: half-window), so the context is the model's positions, not the window
    sliding_window_attention: ClassVar[bool] = True
    #: which hidden state :meth:`classify` reads: ``first`` or ``mean`` (the engine pools)
    classifier_reads: str = "first"

    load_weights = CausalLM.load_weights
    expected_names = CausalLM.expected_names

    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__()
        check_one_rank(parts)
        kinds = layer_types(config)
        if len(kinds) != config.num_hidden_layers or set(kinds) - set(_THETA):
            raise ModelLoadError(f"layer_types {kinds} must name one of "
                                 f"{', '.join(_THETA)} for each of the "
                                 f"{config.num_hidden_layers} layers")
        self.config = config
        self.embeddings = ModernBertEmbeddings(config, parts)
        head_size = config.hidden_size // config.num_attention_heads
        positions = int(config.max_position_embeddings)
        tables: dict[str, RotaryEmbedding] = {}
        for kind in sorted(set(kinds)):
            theta, scaling = _rope(config, kind)
            tables[kind] = RotaryEmbedding(head_size, head_size, positions, theta, True,
                                           scaling, parts, trained_positions=positions)
        self.layers = nn.ModuleList(ModernBertLayer(config, parts, i, kind, tables[kind])
                                    for i, kind in enumerate(kinds))
        self.final_norm = _norm(config, parts)
        self.max_positions = int(config.max_position_embeddings)
        self.num_labels = 0

    def encode(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
               lens: list[int]) -> torch.Tensor:
        """Hidden states ``[tokens, hidden]`` of the packed sequences of ``lens`` tokens
        (``token_type_ids`` is accepted for the encoders' common call and unused)."""
        del token_type_ids
        batch = EncoderBatch.from_lens(lens)
        positions = torch.cat([torch.arange(n) for n in lens])
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, positions, batch)
        return self.final_norm(x)

    classify = BertModel.classify  # the base encoder has no head: one readable line

    def rename(self, name: str) -> str | None:
        name = name.removeprefix("model.")
        if name.startswith(("head.", "decoder.", "classifier.")) and not self.num_labels:
            return None  # the masked-LM head serves no embedding
        return name


class _Head(nn.Module):
    """``head``: ``norm(act(dense(x)))`` on the pooled hidden state."""

    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__()
        h = config.hidden_size
        self.dense = ReplicatedLinear(h, h, bool(getattr(config, "classifier_bias", False)),
                                      parts, "head.dense")
        self.act = Activation(getattr(config, "classifier_activation", "gelu"), parts)
        self.norm = _norm(config, parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class ModernBertForSequenceClassification(ModernBertModel):
    """ModernBERT + ``head`` + ``classifier``: a cross-encoder (rerankers) or classifier."""

    default_task: ClassVar[str] = "classify"

    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__(config, parts)
        pooling = str(getattr(config, "classifier_pooling", "cls"))
        if pooling not in ("cls", "mean"):
            raise ModelLoadError(f"classifier_pooling {pooling!r} is not supported "
                                 "(cls or mean)")
        self.classifier_reads = "first" if pooling == "cls" else "mean"
        self.num_labels = int(getattr(config, "num_labels", 2))
        self.head = _Head(config, parts)
        self.classifier = ReplicatedLinear(config.hidden_size, self.num_labels, True, parts,
                                           "classifier")

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """Logits from the pooled hidden states (``[sequences, hidden]``)."""
        return self.classifier(self.head(pooled))


#: Architectures this module serves.
ENCODERS = {cls.__name__: cls for cls in (ModernBertModel,
                                          ModernBertForSequenceClassification)}
