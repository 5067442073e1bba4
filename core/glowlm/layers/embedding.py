"""Vocabulary-parallel embedding and LM head.

The LM head is dense unless the quantization config stores it quantized
(:meth:`~glowlm.layers.quantization.QuantizationConfig.lm_head_method`: GGUF files,
whose ``output``/``token_embd`` blocks run on the weight-only kernels). A tied
embedding then has no weight of its own: it reads the rows it looks up from the
head's quantized weight, so the vocabulary is held once, quantized, and decode reads
the head's bytes instead of a dense copy's (Gemma 3 270M: 262144 x 640, 335 MB in bf16).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from glowlm.distributed.parallel import divide
from glowlm.layers.context import ModelParts
from glowlm.layers.weights import copy_checked


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
        self.hidden_size = hidden_size
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden_size, dtype=parts.dtype),
                                   requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        #: Set by :meth:`ParallelLMHead.tie` when the tied head is quantized: this
        #: rank's rows ``ids`` in the model dtype (``weight`` is then gone).
        self.rows: Callable[[torch.Tensor], torch.Tensor] | None = None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: object = None) -> None:
        rows = min(self.per_rank, self.vocab_size - self.vocab_start)
        if loaded.shape[0] != self.vocab_size or loaded.shape[1:] != param.shape[1:]:
            copy_checked(param, loaded, self.prefix)  # raises the shape error
        copy_checked(param.data[:rows], loaded.narrow(0, self.vocab_start, rows), self.prefix)
        param.data[rows:].zero_()  # the last rank's padding rows (vocab not divisible by TP)

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            return nn.functional.embedding(ids, self.weight)
        flat = ids.reshape(-1)
        return self.rows(flat).reshape(*ids.shape, -1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.parallel.tp_size == 1:
            return self._lookup(input_ids)
        local = input_ids - self.vocab_start
        valid = (local >= 0) & (local < self.per_rank)
        out = self._lookup(local.clamp(0, self.per_rank - 1))
        out = out * valid.unsqueeze(-1)
        return self.parallel.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits for this rank's vocabulary slice, gathered to full vocab; may tie weights.

    ``method`` is None (dense ``weight``, the ops table's ``dense_linear``) or the
    quantized method the config gives the head; its parameters are sharded by
    vocabulary rows like the dense weight (the last rank's padding rows are zero).
    """

    def __init__(self, vocab_size: int, hidden_size: int, parts: ModelParts, prefix: str,
                 bias: bool = False) -> None:
        super().__init__(vocab_size, hidden_size, parts, prefix)
        self.dense_linear = parts.ops.dense_linear
        self.dtype = parts.dtype
        self.method = (parts.quant_config.lm_head_method(prefix)
                       if parts.quant_config is not None else None)
        if self.method is not None:
            del self.weight
            self.method.create_weights(self, hidden_size, [self.per_rank], parts.dtype)
            for p in self.parameters(recurse=False):
                p.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(self.per_rank, dtype=parts.dtype),
                                     requires_grad=False)

    def tie(self, embedding: VocabParallelEmbedding) -> None:
        if self.method is None:
            self.weight = embedding.weight
            return
        # The checkpoint's one tensor loads into this head (quantized); the embedding
        # looks its rows up here.
        del embedding.weight
        embedding.rows = self.lookup
        self.row_lookup = True

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """This rank's rows ``ids`` of the quantized weight, in the model dtype."""
        assert self.method is not None
        return self.method.lookup(self, ids).to(self.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[tokens, vocab]`` (padding rows of the last rank dropped)."""
        if self.method is not None:
            logits = self.method.apply(self, hidden, self.bias)
        else:
            logits = self.dense_linear(hidden, self.weight, self.bias)
        logits = self.parallel.all_gather_last_dim(logits)
        if logits.shape[1] != self.vocab_size:
            logits = logits[:, : self.vocab_size]
        return logits.float()
