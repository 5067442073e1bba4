"""BERT and XLM-RoBERTa encoders: embedding models and cross-encoder classifiers.

Post-LN transformer encoders with learned absolute positions and token-type
embeddings, as transformers' ``BertModel`` / ``XLMRobertaModel`` lay them out:
``x = LN(x + attn(x)); x = LN(x + down(gelu(up(x))))``. Attention is bidirectional
over each packed sequence (:mod:`glowlm.layers.encoder_attention`), so there is no KV
cache. XLM-RoBERTa differs in two places: positions start after the padding index
(``padding_idx + 1``, transformers' ``create_position_ids_from_input_ids`` for an
unpadded input), and its classifier is ``dense -> tanh -> out_proj`` on the first
token instead of BERT's pooler + linear.

The linears are glowlm's (q/k/v fused into one projection), so the measured linear
choice and the platform's kernels serve encoders as they serve decoders.
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
from glowlm.layers.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from glowlm.layers.norm import LayerNorm
from glowlm.layers.weights import copy_checked
from glowlm.models.base import CausalLM

#: q, k, v of ``attention.self`` into one ``qkv_proj``.
_STACKED = [("qkv_proj", "query", "q"), ("qkv_proj", "key", "k"), ("qkv_proj", "value", "v")]


def check_one_rank(parts: ModelParts) -> None:
    """Encoders run on one rank: the pooling engine has no tensor or pipeline split."""
    if parts.parallel.tp_size > 1 or parts.parallel.pp_size > 1:
        raise ModelLoadError("encoder models run on one rank (no tensor or pipeline "
                             "parallelism)")


class _Table(nn.Module):
    """A lookup table (positions, token types) loaded as the checkpoint stores it."""

    def __init__(self, rows: int, width: int, parts: ModelParts, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.weight = nn.Parameter(torch.zeros(rows, width, dtype=parts.dtype),
                                   requires_grad=False)
        self.weight.weight_loader = self._load  # type: ignore[attr-defined]

    def _load(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        copy_checked(param, loaded, self.prefix)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(ids, self.weight)


class EncoderEmbeddings(nn.Module):
    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__()
        h = config.hidden_size
        self.word_embeddings = VocabParallelEmbedding(config.vocab_size, h, parts,
                                                      "embeddings.word_embeddings")
        self.position_embeddings = _Table(config.max_position_embeddings, h, parts,
                                          "embeddings.position_embeddings")
        self.token_type_embeddings = _Table(max(1, config.type_vocab_size), h, parts,
                                            "embeddings.token_type_embeddings")
        self.LayerNorm = LayerNorm(h, config.layer_norm_eps, parts)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(token_type_ids))
        return self.LayerNorm(x)


class _SelfAttention(nn.Module):
    """``attention.self``: the fused q/k/v projection (checkpoint query/key/value)."""

    def __init__(self, config: Any, parts: ModelParts, prefix: str) -> None:
        super().__init__()
        h, heads = config.hidden_size, config.num_attention_heads
        self.qkv_proj = QKVParallelLinear(h, h // heads, heads, heads, True, parts,
                                          f"{prefix}.qkv_proj")


class _Output(nn.Module):
    """``attention.output`` / ``output``: a projection, the residual add, a LayerNorm."""

    def __init__(self, inp: int, config: Any, parts: ModelParts, prefix: str) -> None:
        super().__init__()
        self.dense = RowParallelLinear(inp, config.hidden_size, True, parts, f"{prefix}.dense")
        self.LayerNorm = LayerNorm(config.hidden_size, config.layer_norm_eps, parts)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class _Attention(nn.Module):
    def __init__(self, config: Any, parts: ModelParts, prefix: str) -> None:
        super().__init__()
        self.self = _SelfAttention(config, parts, f"{prefix}.self")
        self.output = _Output(config.hidden_size, config, parts, f"{prefix}.output")


class _Intermediate(nn.Module):
    def __init__(self, config: Any, parts: ModelParts, prefix: str) -> None:
        super().__init__()
        self.dense = ColumnParallelLinear(config.hidden_size, [config.intermediate_size], True,
                                          parts, f"{prefix}.dense")
        self.act = Activation(config.hidden_act, parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class EncoderLayer(nn.Module):
    def __init__(self, config: Any, parts: ModelParts, prefix: str) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.hidden = config.hidden_size
        self.scale = (config.hidden_size // config.num_attention_heads) ** -0.5
        self.attention = _Attention(config, parts, f"{prefix}.attention")
        self.intermediate = _Intermediate(config, parts, f"{prefix}.intermediate")
        self.output = _Output(config.intermediate_size, config, parts, f"{prefix}.output")

    def forward(self, x: torch.Tensor, batch: EncoderBatch) -> torch.Tensor:
        h = self.hidden
        q, k, v = self.attention.self.qkv_proj(x).split([h, h, h], dim=-1)
        attn = bidirectional_attention(q, k, v, batch, self.num_heads, self.scale)
        x = self.attention.output(attn, x)
        return self.output(self.intermediate(x), x)


class _Encoder(nn.Module):
    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__()
        self.layer = nn.ModuleList(EncoderLayer(config, parts, f"encoder.layer.{i}")
                                   for i in range(config.num_hidden_layers))


class _BertPooler(nn.Module):
    """BERT's ``pooler``: ``tanh(dense(first token))``, the classifier's input."""

    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__()
        h = config.hidden_size
        self.dense = ReplicatedLinear(h, h, True, parts, "pooler.dense")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x))


class BertModel(nn.Module):
    """The encoder: packed token ids (+ token types) -> hidden states of every token.

    Parameter names are the base model's checkpoint names (``embeddings.*``,
    ``encoder.layer.{i}.*``); :meth:`rename` strips the ``bert.`` / ``roberta.`` prefix
    a task model's checkpoint adds.
    """

    #: read by the loader and the pooling engine before a model is built
    is_pooling_model: ClassVar[bool] = True
    is_encoder: ClassVar[bool] = True
    default_pooling_type: ClassVar[str] = "CLS"
    #: the task the architecture serves when ``convert`` is ``auto``
    default_task: ClassVar[str] = "embed"
    stacked_params = _STACKED
    _prefixes: ClassVar[tuple[str, ...]] = ("bert.",)
    #: first position id of a sequence (XLM-RoBERTa: after the padding index)
    position_offset: int = 0

    load_weights = CausalLM.load_weights  # the shared loading loop (stacked q/k/v)
    expected_names = CausalLM.expected_names

    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__()
        check_one_rank(parts)
        if getattr(config, "position_embedding_type", "absolute") not in (None, "absolute"):
            raise ModelLoadError(f"position_embedding_type "
                                 f"{config.position_embedding_type!r} is not supported "
                                 "(absolute only)")
        if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
            raise ModelLoadError("BERT as a decoder (is_decoder / cross-attention) is not "
                                 "supported; glowlm runs BERT-family models as encoders")
        self.config = config
        self.embeddings = EncoderEmbeddings(config, parts)
        self.encoder = _Encoder(config, parts)
        #: positions a sequence may use
        self.max_positions = config.max_position_embeddings - self.position_offset
        self.num_labels = 0

    def positions(self, lens: list[int]) -> torch.Tensor:
        return torch.cat([torch.arange(self.position_offset, self.position_offset + n)
                          for n in lens])

    def encode(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
               lens: list[int]) -> torch.Tensor:
        """Hidden states ``[tokens, hidden]`` of the packed sequences of ``lens`` tokens
        (equal lengths next to each other make one attention call per run)."""
        batch = EncoderBatch.from_lens(lens)
        x = self.embeddings(input_ids, self.positions(lens), token_type_ids)
        for layer in self.encoder.layer:
            x = layer(x, batch)
        return x

    def classify(self, first: torch.Tensor) -> torch.Tensor:
        raise ModelLoadError(f"{type(self).__name__} has no classification head; serve a "
                             "*ForSequenceClassification checkpoint")

    def rename(self, name: str) -> str | None:
        for prefix in self._prefixes:
            if name.startswith(prefix):
                name = name[len(prefix):]
        if name.startswith(("pooler.", "cls.", "lm_head.")) and not self.num_labels:
            return None  # the MLM head and BERT's pooler serve no embedding
        return name


class BertForSequenceClassification(BertModel):
    """BERT + ``pooler`` + ``classifier``: a cross-encoder (rerankers) or classifier."""

    default_task: ClassVar[str] = "classify"

    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__(config, parts)
        self.num_labels = int(getattr(config, "num_labels", 2))
        self.pooler = _BertPooler(config, parts)
        self.classifier = ReplicatedLinear(config.hidden_size, self.num_labels, True, parts,
                                           "classifier")

    def classify(self, first: torch.Tensor) -> torch.Tensor:
        """Logits from the first token's hidden state."""
        return self.classifier(self.pooler(first))


class XLMRobertaModel(BertModel):
    _prefixes = ("roberta.",)

    def __init__(self, config: Any, parts: ModelParts) -> None:
        self.position_offset = int(getattr(config, "pad_token_id", 1) or 0) + 1
        super().__init__(config, parts)


class _RobertaHead(nn.Module):
    def __init__(self, config: Any, num_labels: int, parts: ModelParts) -> None:
        super().__init__()
        h = config.hidden_size
        self.dense = ReplicatedLinear(h, h, True, parts, "classifier.dense")
        self.out_proj = ReplicatedLinear(h, num_labels, True, parts, "classifier.out_proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(x)))


class XLMRobertaForSequenceClassification(XLMRobertaModel):
    """XLM-RoBERTa + ``dense -> tanh -> out_proj`` on the first token (bge-reranker)."""

    default_task: ClassVar[str] = "classify"

    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__(config, parts)
        self.num_labels = int(getattr(config, "num_labels", 2))
        self.classifier = _RobertaHead(config, self.num_labels, parts)

    def classify(self, first: torch.Tensor) -> torch.Tensor:
        return self.classifier(first)

    def rename(self, name: str) -> str | None:
        if name.startswith("roberta.pooler."):
            return None
        return super().rename(name)


#: Architectures this module serves.
ENCODERS = {cls.__name__: cls for cls in (BertModel, BertForSequenceClassification,
                                          XLMRobertaModel, XLMRobertaForSequenceClassification)}
