"""OpenAI-compatible response models of the requests answered whole (not streamed).

Stream chunks are plain dicts built in the serving modules: they are small, many,
and their exact shape (which keys are present) matters to clients.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    #: vLLM's: per prompt token, {token id: {logprob, rank, decoded_token}}; first None.
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class ChatLogProb(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogProbsContent(ChatLogProb):
    top_logprobs: list[ChatLogProb] = Field(default_factory=list)


class ChatChoiceLogProbs(BaseModel):
    content: list[ChatLogProbsContent] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None


def prompt_logprobs_json(entries: list[Any] | None, texts: dict[int, str]
                         ) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's ``prompt_logprobs``: per prompt position ``{token id: {logprob, rank,
    decoded_token}}`` (the first position ``None``); ``texts`` decodes token ids."""
    if entries is None:
        return None
    out: list[dict[str, dict[str, Any]] | None] = []
    for entry in entries:
        if entry is None:
            out.append(None)
            continue
        out.append({str(tid): {"logprob": max(lp.logprob, -9999.0), "rank": lp.rank,
                               "decoded_token": texts.get(tid, "")}
                    for tid, lp in entry.items()})
    return out


def prompt_logprob_ids(entries: list[Any] | None) -> list[int]:
    """Every token id the prompt logprobs mention (to decode them in one call)."""
    return sorted({tid for e in entries or [] if e for tid in e})
