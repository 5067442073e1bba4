"""The ``/v1/chat/completions`` request: messages (text parts only), tools and the
tool choice; each message as the chat template receives it."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from glowlm.entrypoints.openai.errors import APIError
from glowlm.entrypoints.openai.protocol.common import INT_LIMIT, OpenAIModel, SamplingRequest


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message; extra keys (name, tool_call_id...) go to the chat template as given."""

    model_config = ConfigDict(extra="allow")
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
        """The message as chat templates expect it: content as one string, and tool-call
        arguments as objects (OpenAI sends them as JSON text; templates index into them,
        as vLLM prepares them)."""
        out = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            out["content"] = "".join(p.text for p in self.content)
        calls = out.get("tool_calls")
        if isinstance(calls, list):
            fixed = []
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    try:
                        call = {**call, "function": {**fn,
                                                     "arguments": json.loads(fn["arguments"])}}
                    except json.JSONDecodeError:
                        pass
                fixed.append(call)
            out["tool_calls"] = fixed
        return out


class FunctionDefinition(OpenAIModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(OpenAIModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, le=INT_LIMIT)
    max_completion_tokens: int | None = Field(None, le=INT_LIMIT)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, le=INT_LIMIT)
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    # vLLM's extras:
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _tool_choice_default(self) -> ChatCompletionRequest:
        if self.tool_choice is None:  # OpenAI's default: auto with tools, else none
            self.tool_choice = "auto" if self.tools else "none"
        return self

    def check_tools(self) -> None:
        """``required`` and named choices need tools, and the named one must exist."""
        choice = self.tool_choice
        if choice in ("required",) or isinstance(choice, NamedToolChoice):
            if not self.tools:
                raise APIError("tool_choice needs tools", param="tool_choice")
        if isinstance(choice, NamedToolChoice):
            names = [t.function.name for t in self.tools or []]
            if choice.function.name not in names:
                raise APIError(f"tool_choice names {choice.function.name!r}, which is not "
                               f"among the tools ({', '.join(names)})", param="tool_choice")
