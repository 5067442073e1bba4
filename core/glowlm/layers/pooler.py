"""Pooling heads: packed hidden states -> one vector per sequence (or one per token).

A pooling model's forward returns the final hidden states of every token of every
sequence in the step, packed without padding (``[tokens, hidden]``, sequence ``i`` at
rows ``starts[i] : starts[i] + lens[i]``). The pooler reduces each sequence the way the
checkpoint says (``1_Pooling/config.json`` of a sentence-transformers directory, or
vLLM's ``--pooler-config``): the first token (``CLS``), the mean of all tokens
(``MEAN``), the last token (``LAST``: decoder embedding models such as Qwen3-Embedding),
or every token (``ALL``, the token-level ``/pooling`` output). Sentence-transformers'
``Dense`` modules then project the pooled vector, and ``Normalize`` scales it to unit
length. Reductions run in float32 whatever the model dtype: a mean over 512 bf16 rows
would lose the low bits of every row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from glowlm.errors import ConfigError

POOLING_TYPES = ("CLS", "MEAN", "LAST", "ALL")

#: sentence-transformers' Dense ``activation_function`` names -> the function.
_DENSE_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.Tanh": torch.tanh,
    "torch.nn.modules.activation.ReLU": torch.relu,
    "torch.nn.modules.activation.GELU": nn.functional.gelu,
    "torch.nn.modules.activation.Sigmoid": torch.sigmoid,
}


@dataclass
class PoolerConfig:
    """How a pooling model reduces its hidden states (vLLM's ``--pooler-config`` keys).

    ``None`` fields mean "as the checkpoint says" and are filled from the
    sentence-transformers layout or the model's default (``CLS`` for encoders,
    ``LAST`` for decoders; normalized embeddings).
    """

    pooling_type: str | None = None
    normalize: bool | None = None
    #: Matryoshka: the dimensions a request may truncate to (None: any up to the size).
    dimensions: int | None = None
    #: Classification: softmax (several labels) / sigmoid (one label) on the logits.
    activation: bool | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> PoolerConfig:
        """Parse ``--pooler-config`` JSON; unknown keys are an error naming the valid ones."""
        raw = dict(raw or {})
        if "softmax" in raw and "activation" not in raw:  # vLLM's older name
            raw["activation"] = raw.pop("softmax")
        known = {"pooling_type", "normalize", "dimensions", "activation"}
        unknown = set(raw) - known
        if unknown:
            raise ConfigError(f"--pooler-config: unknown key(s) {', '.join(sorted(unknown))} "
                              f"(known: {', '.join(sorted(known))})")
        out = cls(**raw)
        if out.pooling_type is not None:
            out.pooling_type = str(out.pooling_type).upper()
            if out.pooling_type not in POOLING_TYPES:
                raise ConfigError(f"--pooler-config pooling_type {raw['pooling_type']!r} is "
                                  f"not one of {', '.join(POOLING_TYPES)}")
        return out


@dataclass
class DenseLayer:
    """One sentence-transformers ``Dense`` module: ``act(x @ w.T + b)``."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    activation: str = "torch.nn.modules.linear.Identity"

    def __post_init__(self) -> None:
        if self.activation not in _DENSE_ACTIVATIONS:
            raise ConfigError(f"sentence-transformers Dense activation {self.activation!r} is "
                              f"not supported (supported: {', '.join(_DENSE_ACTIVATIONS)})")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = nn.functional.linear(x, self.weight.float(),
                                   None if self.bias is None else self.bias.float())
        return _DENSE_ACTIVATIONS[self.activation](out)


@dataclass
class Pooler:
    """The resolved pooling of one model: the reduction, the Dense projections, the norm."""

    pooling_type: str
    normalize: bool
    dense: list[DenseLayer] = field(default_factory=list)
    dimensions: int | None = None
    activation: bool = True

    def reduce(self, hidden: torch.Tensor, starts: list[int], lens: list[int],
               pooling_type: str | None = None) -> torch.Tensor:
        """``[sequences, hidden]`` in float32: each sequence's rows reduced."""
        kind = pooling_type or self.pooling_type
        if kind == "CLS":
            return hidden[torch.tensor(starts)].float()
        if kind == "LAST":
            return hidden[torch.tensor([s + n - 1 for s, n in zip(starts, lens, strict=True)])
                          ].float()
        if kind == "MEAN":
            seg = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
            rows = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
            sums = torch.zeros(len(lens), hidden.shape[1], dtype=torch.float32)
            sums.index_add_(0, seg, hidden[rows].float())
            return sums / torch.tensor(lens, dtype=torch.float32).unsqueeze(1)
        raise ConfigError(f"pooling type {kind!r} does not reduce to one vector per sequence")

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        """The Dense modules, in the directory's order."""
        for layer in self.dense:
            pooled = layer(pooled)
        return pooled

    def finish(self, vector: torch.Tensor, dimensions: int | None, normalize: bool | None
               ) -> torch.Tensor:
        """Matryoshka truncation (then) L2 normalization, as vLLM orders them: a truncated
        normalized embedding is normalized again, so it keeps unit length."""
        if dimensions is not None:
            vector = vector[..., :dimensions]
        if self.normalize if normalize is None else normalize:
            vector = nn.functional.normalize(vector, p=2, dim=-1)
        return vector


def classification_probs(logits: torch.Tensor, activation: bool) -> torch.Tensor:
    """Softmax over the labels, or sigmoid for a single-label (cross-encoder) head, as
    vLLM and sentence-transformers' CrossEncoder apply them; raw logits if not wanted."""
    logits = logits.float()
    if not activation:
        return logits
    return torch.sigmoid(logits) if logits.shape[-1] == 1 else torch.softmax(logits, dim=-1)
