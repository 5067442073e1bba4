"""OpenAI-compatible request and response models.

Requests are parsed strictly: ``"0.5"`` is not a number, ``1.0`` is not an
integer, and unknown fields are refused. A typo such as ``max_token`` is then a
400 naming the field instead of a setting silently ignored. Fields OpenAI
defines but glowlm cannot honour (``logit_bias``, ``suffix``, ``tools``...) are
accepted only at their neutral value. Numeric ranges are checked once, by
:class:`~glowlm.sampling.params.SamplingParams`, not repeated here.

Responses that are sent whole are models too; stream chunks are plain dicts
built in the serving modules, because they are small, many, and their exact
shape (which keys are present) matters to clients.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

#: JSON ints beyond this would overflow the int64 tensors the sampler builds.
_INT_LIMIT = 2**62


class APIError(Exception):
    """An error returned to the client in OpenAI's shape, with its HTTP status."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type or _TYPE_BY_STATUS.get(status, "invalid_request_error")
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


_TYPE_BY_STATUS = {401: "authentication_error", 404: "invalid_request_error",
                   500: "server_error", 503: "service_unavailable"}


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_to_api_error(exc: ValidationError) -> APIError:
    """The first pydantic error as one readable 400 naming the field."""
    err = exc.errors(include_url=False)[0]
    where = _loc(tuple(err["loc"]))
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "json_invalid":
        return APIError(f"the request body is not valid JSON: {msg}", code="invalid_json")
    if err["type"] == "extra_forbidden":
        return APIError(f"unrecognized request argument: {where}", param=where,
                        code="unknown_field")
    if not where:
        return APIError(f"the request body must be a JSON object: {msg}", code="invalid_body")
    return APIError(f"{where}: {msg}", param=str(err["loc"][0]), code="invalid_value")


def parse_request(model: type[BaseModel], body: bytes) -> Any:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise validation_to_api_error(exc) from None


_FIELD = re.compile(r"^([a-z_]+)")


def param_of(message: str, known: set[str]) -> str | None:
    """The field a SamplingParams/engine message starts with, if it is a request field."""
    m = _FIELD.match(message)
    return m.group(1) if m and m.group(1) in known else None


# -- requests ------------------------------------------------------------------------------


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(OpenAIModel):
    include_usage: bool = False


class SamplingRequest(OpenAIModel):
    """Fields shared by completions and chat completions (OpenAI's, then vLLM's extras)."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = Field(1, le=_INT_LIMIT)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-_INT_LIMIT, le=_INT_LIMIT)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extra sampling fields:
    top_k: int | None = Field(None, ge=-_INT_LIMIT, le=_INT_LIMIT)
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = Field(0, le=_INT_LIMIT)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            raise ValueError("logit_bias is not supported by glowlm; leave it empty")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _token_ids_in_range(cls, v: list[int] | None) -> list[int] | None:
        if v and any(not 0 <= t < _INT_LIMIT for t in v):
            raise ValueError("token ids must be non-negative integers")
        return v

    def check_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise APIError("stream_options is only allowed when stream is true",
                           param="stream_options")


class CompletionRequest(SamplingRequest):
    #: A string, a list of strings, a list of token ids, or a list of such lists.
    prompt: Any
    max_tokens: int | None = Field(16, le=_INT_LIMIT)
    logprobs: int | None = Field(None, le=_INT_LIMIT)
    echo: bool = False
    best_of: int | None = Field(None, le=_INT_LIMIT)
    suffix: str | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix (insertion) is not supported by glowlm")
        return v


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message; extra keys (name, tool_call_id...) go to the chat template as given."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        if isinstance(v, list):
            for part in v:
                if isinstance(part, dict) and part.get("type") not in (None, "text"):
                    raise ValueError(f"content parts of type {part.get('type')!r} are not "
                                     "supported; only 'text' parts are")
        return v

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates expect it: content as one string."""
        out = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            out["content"] = "".join(p.text for p in self.content)
        return out


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, le=_INT_LIMIT)
    max_completion_tokens: int | None = Field(None, le=_INT_LIMIT)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, le=_INT_LIMIT)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's extras:
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("response_format")
    @classmethod
    def _text_format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type") != "text":
            raise ValueError("only {'type': 'text'} is supported")
        return v

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if v:
            raise ValueError("tool calling is not supported by glowlm")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if v not in (None, "none", "auto"):
            raise ValueError("tool calling is not supported by glowlm")
        return v


class TokenizeRequest(OpenAIModel):
    """vLLM's /tokenize: either a prompt or chat messages (rendered by the template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[int]


# -- responses -----------------------------------------------------------------------------


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


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None


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
