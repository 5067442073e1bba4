"""What a pooling request asks for and returns, shaped like vLLM's so user code ports.

``PoolingParams`` is vLLM's (``task``, ``dimensions``, ``normalize``, ``activation``,
``truncate_prompt_tokens``); the outputs are vLLM's ``PoolingRequestOutput`` and its
typed views (``EmbeddingRequestOutput.outputs.embedding``,
``ClassificationRequestOutput.outputs.probs``, ``ScoringRequestOutput.outputs.score``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from glowlm.engine.outputs import RequestMetrics
from glowlm.errors import RequestError

TASKS = ("embed", "classify", "score", "encode")


@dataclass
class PoolingParams:
    """``task``: ``embed`` (one vector), ``classify`` (label probabilities), ``score``
    (a cross-encoder's relevance of a text pair), ``encode`` (every token's vector).
    None fields take the model's pooler settings."""

    task: str | None = None
    dimensions: int | None = None
    normalize: bool | None = None
    activation: bool | None = None
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.task is not None and self.task not in TASKS:
            raise RequestError(f"task {self.task!r} is not one of {', '.join(TASKS)}")
        if self.dimensions is not None and (not isinstance(self.dimensions, int)
                                            or self.dimensions < 1):
            raise RequestError(f"dimensions must be an integer >= 1, got {self.dimensions!r}")
        t = self.truncate_prompt_tokens
        if t is not None and (not isinstance(t, int) or (t < 1 and t != -1)):
            raise RequestError(f"truncate_prompt_tokens must be -1 or an integer >= 1, got {t!r}")


@dataclass
class PoolingOutput:
    """The pooled tensor (float32): ``[dim]``, ``[labels]``, ``[1]`` or ``[tokens, dim]``."""

    data: torch.Tensor


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float


@dataclass
class PoolingRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: Any
    finished: bool = True
    prompt: str | None = None
    metrics: RequestMetrics | None = None
    extras: dict[str, object] = field(default_factory=dict)


class EmbeddingRequestOutput(PoolingRequestOutput):
    @classmethod
    def from_base(cls, out: PoolingRequestOutput) -> EmbeddingRequestOutput:
        return cls(out.request_id, out.prompt_token_ids,
                   EmbeddingOutput(out.outputs.data.tolist()), out.finished, out.prompt,
                   out.metrics)


class ClassificationRequestOutput(PoolingRequestOutput):
    @classmethod
    def from_base(cls, out: PoolingRequestOutput) -> ClassificationRequestOutput:
        return cls(out.request_id, out.prompt_token_ids,
                   ClassificationOutput(out.outputs.data.tolist()), out.finished, out.prompt,
                   out.metrics)


class ScoringRequestOutput(PoolingRequestOutput):
    @classmethod
    def make(cls, out: PoolingRequestOutput, score: float) -> ScoringRequestOutput:
        return cls(out.request_id, out.prompt_token_ids, ScoringOutput(float(score)),
                   out.finished, out.prompt, out.metrics)
