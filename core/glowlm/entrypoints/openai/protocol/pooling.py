"""The pooling routes' requests: OpenAI's ``/v1/embeddings``, vLLM's ``/score``,
``/classify`` and ``/pooling``, and the Jina/Cohere ``/rerank`` shape vLLM serves."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from glowlm.entrypoints.openai.protocol.common import OpenAIModel

#: a text, token ids, or a list of either (OpenAI's embeddings ``input``)
PoolingInput = str | list[str] | list[int] | list[list[int]]


class _PoolingBase(OpenAIModel):
    model: str | None = None
    #: keep the last k tokens of token-id inputs, the first k of texts (-1: the maximum)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    user: str | None = None


class EmbeddingRequest(_PoolingBase):
    input: PoolingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    normalize: bool | None = None


class PoolingRequest(_PoolingBase):
    """vLLM's ``/pooling``: the model's raw pooled output (``task='encode'``: every token's)."""

    input: PoolingInput
    encoding_format: Literal["float", "base64"] = "float"
    task: Literal["embed", "encode", "classify"] | None = None
    normalize: bool | None = None


class ClassificationRequest(_PoolingBase):
    input: PoolingInput
    activation: bool | None = None


class ScoreRequest(_PoolingBase):
    """vLLM's ``/score``: ``text_1`` (one text, or as many as ``text_2``) against
    ``text_2``; ``queries`` / ``documents`` are accepted as the same two fields."""

    text_1: str | list[str] | None = Field(default=None, alias="text_1")
    text_2: str | list[str] | None = None
    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    activation: bool | None = None

    model_config = OpenAIModel.model_config | {"populate_by_name": True}


class RerankRequest(_PoolingBase):
    """Jina's and Cohere's rerank: ``query``, ``documents`` (texts, or objects with a
    ``text``), ``top_n``; results ranked by ``relevance_score``."""

    query: str
    documents: list[str | dict[str, Any]]
    top_n: int | None = Field(default=None, ge=0)
    return_documents: bool = True
