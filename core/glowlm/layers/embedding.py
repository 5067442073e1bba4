"""Vocabulary-parallel embedding and LM head."""

from __future__ import annotations

import torch
from torch import nn

from glowlm.distributed.parallel import divide
from glowlm.layers.context import ModelParts
from glowlm.layers.linear import _copy_checked


class VocabParallelEmbedding(nn.Module):
    """Each TP rank holds a contiguous slice of the vocabulary rows."""

    def __init__(self, vocab_size: int, hidden_size: int, parts: ModelParts, prefix: str
                 ) -> None:
        super().__init__()
        self.prefix = prefix
        self.parallel = parts.parallel
        tp = parts.parallel.tp_size
        self.padded_vocab = -(-vocab_size // tp) * tp
        self.per_rank = divide(self.padded_vocab, tp, prefix)
        self.vocab_start = parts.parallel.tp_rank * self.per_rank
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden_size, dtype=parts.dtype),
                                   requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: object = None) -> None:
        rows = min(self.per_rank, self.vocab_size - self.vocab_start)
        if loaded.shape[0] != self.vocab_size or loaded.shape[1:] != param.shape[1:]:
            _copy_checked(param, loaded, self.prefix)  # raises the shape error
        _copy_checked(param.data[:rows], loaded.narrow(0, self.vocab_start, rows), self.prefix)
        param.data[rows:].zero_()  # the last rank's padding rows (vocab not divisible by TP)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.parallel.tp_size == 1:
            return nn.functional.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        valid = (local >= 0) & (local < self.per_rank)
        out = nn.functional.embedding(local.clamp(0, self.per_rank - 1), self.weight)
        out = out * valid.unsqueeze(-1)
        return self.parallel.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits for this rank's vocabulary slice, gathered to full vocab; may tie weights."""

    def __init__(self, vocab_size: int, hidden_size: int, parts: ModelParts, prefix: str,
                 bias: bool = False) -> None:
        super().__init__(vocab_size, hidden_size, parts, prefix)
        self.dense_linear = parts.ops.dense_linear
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(self.per_rank, dtype=parts.dtype),
                                     requires_grad=False)

    def tie(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[tokens, vocab]`` (padding rows of the last rank dropped)."""
        logits = self.dense_linear(hidden, self.weight, self.bias)
        logits = self.parallel.all_gather_last_dim(logits)
        if logits.shape[1] != self.vocab_size:
            logits = logits[:, : self.vocab_size]
        return logits.float()
