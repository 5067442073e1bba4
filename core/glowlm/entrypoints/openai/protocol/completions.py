"""The ``/v1/completions`` request: a prompt (text, token ids, or lists of either)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from glowlm.entrypoints.openai.protocol.common import INT_LIMIT, SamplingRequest


class CompletionRequest(SamplingRequest):
    #: A string, a list of strings, a list of token ids, or a list of such lists.
    prompt: Any
    max_tokens: int | None = Field(16, le=INT_LIMIT)
    logprobs: int | None = Field(None, le=INT_LIMIT)
    echo: bool = False
    best_of: int | None = Field(None, le=INT_LIMIT)
    suffix: str | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix (insertion) is not supported by glowlm")
        return v
