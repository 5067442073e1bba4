"""Tool calling for chat completions: what ``tool_choice`` asks, and reading the calls.

``none``: the tools go to the chat template, the output is content.
``auto``: the model decides; ``--tool-call-parser`` reads its calls from the
text (needs ``--enable-auto-tool-choice``, as in vLLM).
``required`` and a named function: enforced with structured outputs, as vLLM
does. Named: the output is constrained to the function's parameter schema and
*is* the arguments. Required: the output is a JSON array of
``{"name", "parameters"}`` objects, one schema branch per tool (at most one
item without ``parallel_tool_calls``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from glowlm.entrypoints.openai.errors import APIError
from glowlm.entrypoints.openai.protocol import ChatCompletionRequest, NamedToolChoice
from glowlm.entrypoints.openai.responses import FunctionCall, ToolCall
from glowlm.entrypoints.openai.tool_parsers import StreamingToolState, ToolParser
from glowlm.entrypoints.openai.tool_parsers.base import ParsedCall, tool_call_id
from glowlm.sampling.params import StructuredOutputsParams

_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def required_schema(req: ChatCompletionRequest) -> dict[str, Any]:
    """JSON schema of a non-empty array of calls to the request's tools."""
    branches = [{"type": "object",
                 "properties": {"name": {"type": "string", "enum": [t.function.name]},
                                "parameters": t.function.parameters or _ANY_OBJECT},
                 "required": ["name", "parameters"], "additionalProperties": False}
                for t in req.tools or []]
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": branches[0] if len(branches) == 1
                              else {"anyOf": branches}}
    if req.parallel_tool_calls is False:
        schema["maxItems"] = 1
    return schema


@dataclass
class ToolMode:
    """How one request's output becomes tool calls."""

    kind: str                                 # "none" | "auto" | "required" | "named"
    parser: ToolParser | None = None
    name: str | None = None                   # the named function
    parallel: bool = True                     # parallel_tool_calls: false keeps the first
    call_ids: dict[int, str] = field(default_factory=dict)  # named: one id per choice

    def constraint(self, req: ChatCompletionRequest) -> StructuredOutputsParams | None:
        if self.kind == "named":
            fn = next(t.function for t in req.tools or [] if t.function.name == self.name)
            return StructuredOutputsParams(json=fn.parameters or _ANY_OBJECT)
        if self.kind == "required":
            return StructuredOutputsParams(json=required_schema(req))
        return None

    # -- whole responses ---------------------------------------------------------------

    def message(self, text: str, finish_reason: str | None
                ) -> tuple[str | None, list[ToolCall], str | None]:
        """(content, tool calls, finish reason) of one finished choice."""
        if self.kind == "named":
            assert self.name is not None
            return None, [ToolCall(id=tool_call_id(), function=FunctionCall(
                name=self.name, arguments=text))], finish_reason
        if self.kind == "required":
            calls = _required_calls(text)
            if calls:
                return None, [_tool_call(c) for c in calls], "tool_calls"
            return text, [], finish_reason
        if self.kind == "auto" and self.parser is not None:
            found = self.parser.extract_tool_calls(text)
            if found.tools_called:
                calls = found.tool_calls if self.parallel else found.tool_calls[:1]
                return found.content, [_tool_call(c) for c in calls], "tool_calls"
        return text, [], finish_reason

    # -- streams -------------------------------------------------------------------------

    def stream_state(self) -> _StreamState:
        return _StreamState(self)


def _required_calls(text: str) -> list[ParsedCall]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        return []
    if not isinstance(items, list):
        return []
    return [ParsedCall(i["name"], json.dumps(i.get("parameters", {}), ensure_ascii=False))
            for i in items if isinstance(i, dict) and "name" in i]


def _tool_call(c: ParsedCall) -> ToolCall:
    return ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))


class _StreamState:
    """One choice's stream: content deltas, tool-call deltas, and its finish reason."""

    def __init__(self, mode: ToolMode) -> None:
        self.mode = mode
        self.sent = 0          # characters of text already turned into deltas
        self.calls = 0         # tool calls sent
        self.named_id: str | None = None
        self.parser_state = StreamingToolState(mode.parser) if mode.parser else None

    def delta(self, text: str, finished: bool) -> dict[str, Any]:
        """The ``delta`` object for the text so far (may be empty)."""
        kind = self.mode.kind
        if kind == "named":
            piece = text[self.sent:]
            self.sent = len(text)
            call: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
            if self.named_id is None:
                self.named_id = tool_call_id()
                call.update(id=self.named_id, type="function")
                call["function"]["name"] = self.mode.name
            elif not piece:
                return {}
            return {"tool_calls": [call]}
        if kind == "required":
            if not finished:
                return {}  # the array is parsed whole at the end
            calls = _required_calls(text)
            if not calls:
                piece, self.sent = text[self.sent:], len(text)
                return {"content": piece}
            return {"tool_calls": self._call_deltas(calls)}
        if self.parser_state is not None:
            content, new = self.parser_state.update(text, finished)
            if not self.mode.parallel:
                new = new[:max(0, 1 - self.calls)]
            out: dict[str, Any] = {}
            if content:
                out["content"] = content
            if new:
                out["tool_calls"] = self._call_deltas(new)
            return out
        piece, self.sent = text[self.sent:], len(text)
        return {"content": piece}

    def _call_deltas(self, calls: list[ParsedCall]) -> list[dict[str, Any]]:
        out = []
        for c in calls:
            out.append({"index": self.calls, "id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}})
            self.calls += 1
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        if reason is not None and self.calls and self.mode.kind in ("auto", "required"):
            return "tool_calls"
        return reason


def tool_mode(req: ChatCompletionRequest, parser_cls: type[ToolParser] | None,
              auto_enabled: bool) -> ToolMode:
    """What the request's ``tool_choice`` means on this server; 400 if it cannot be served."""
    req.check_tools()
    choice = req.tool_choice
    if isinstance(choice, NamedToolChoice):
        return ToolMode("named", name=choice.function.name)
    if choice == "required":
        return ToolMode("required")
    if choice == "auto" and req.tools:
        if not auto_enabled or parser_cls is None:
            raise APIError('"auto" tool choice requires --enable-auto-tool-choice and '
                           "--tool-call-parser to be set", param="tool_choice")
        return ToolMode("auto", parser=parser_cls(
            [t.model_dump(exclude_none=True) for t in req.tools]),
            parallel=req.parallel_tool_calls is not False)
    return ToolMode("none")
