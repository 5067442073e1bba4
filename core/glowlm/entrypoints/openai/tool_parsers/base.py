"""What every tool-call parser shares: the result types and the streaming state machine.

A parser says where its tool-call section starts (``find_start``) and how to
read the calls out of text (``parse``). Streaming is the same for every
format: text before the section streams as content (minus a tail that could
be the start of the section's marker), and each tool call is sent as one delta
(id, name, whole arguments) as soon as it is complete in the text.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


def tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


@dataclass
class ParsedCall:
    name: str
    arguments: str  # JSON text, as OpenAI's API carries it
    id: str = field(default_factory=tool_call_id)


@dataclass
class ExtractedToolCalls:
    tools_called: bool
    tool_calls: list[ParsedCall]
    content: str | None


def arguments_text(value: Any) -> str:
    """Arguments as JSON text: objects are dumped, text that is JSON already is kept."""
    if isinstance(value, str):
        try:
            json.loads(value)
            return value
        except json.JSONDecodeError:
            return json.dumps(value, ensure_ascii=False)
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


class ToolParser:
    """Base: subclasses set ``markers`` and implement ``parse``."""

    #: Strings that open the tool-call section; the first found wins.
    markers: tuple[str, ...] = ()

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self.tools = tools or []

    def find_start(self, text: str) -> int | None:
        """Index where the tool-call section starts, or None."""
        hits = [i for i in (text.find(m) for m in self.markers) if i >= 0]
        return min(hits) if hits else None

    def hold_back(self, text: str) -> int:
        """How many trailing characters might be the start of a marker (not yet content)."""
        best = 0
        for m in self.markers:
            for k in range(min(len(m) - 1, len(text)), 0, -1):
                if text.endswith(m[:k]):
                    best = max(best, k)
                    break
        return best

    def parse(self, section: str, final: bool) -> list[ParsedCall]:
        """The calls in ``section`` (which starts at the marker). Not ``final``: only
        calls whose text is complete."""
        raise NotImplementedError

    def extract_tool_calls(self, text: str) -> ExtractedToolCalls:
        start = self.find_start(text)
        if start is None:
            return ExtractedToolCalls(False, [], text)
        try:
            calls = self.parse(text[start:], final=True)
        except (ValueError, KeyError, TypeError):
            calls = []
        if not calls:
            return ExtractedToolCalls(False, [], text)
        content = text[:start].strip() or None
        return ExtractedToolCalls(True, calls, content)

    def schema_types(self, function: str) -> dict[str, Any]:
        """The JSON-schema properties of ``function``'s parameters, if it is a known tool."""
        for tool in self.tools:
            fn = tool.get("function", {})
            if fn.get("name") == function:
                return dict((fn.get("parameters") or {}).get("properties") or {})
        return {}


class StreamingToolState:
    """Turns growing output text into content deltas and whole tool-call deltas."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.content_sent = 0
        self.calls: list[ParsedCall] = []
        self.start: int | None = None

    def update(self, text: str, finished: bool) -> tuple[str, list[ParsedCall]]:
        """(content delta, newly complete tool calls) for the text so far."""
        content = ""
        if self.start is None:
            self.start = self.parser.find_start(text)
            if self.start is None:
                safe = len(text) if finished else len(text) - self.parser.hold_back(text)
                content = text[self.content_sent:max(safe, self.content_sent)]
                self.content_sent += len(content)
                return content, []
            content = text[self.content_sent:self.start]
            self.content_sent = self.start
        try:
            calls = self.parser.parse(text[self.start:], final=finished)
        except (ValueError, KeyError, TypeError):
            calls = []
        new = calls[len(self.calls):]
        self.calls.extend(new)
        if finished and not self.calls:  # a marker, then nothing parseable: it was text
            content += text[self.content_sent:]
            self.content_sent = len(text)
        return content, new
