"""Llama 3.1+ JSON format: ``{"name": ..., "parameters": {...}}`` (optionally after
``<|python_tag|>``), several calls separated by ``;``. As in vLLM, the output must
*start* with the call: JSON later in a sentence is content."""

from __future__ import annotations

import json

from glowlm.entrypoints.openai.tool_parsers.base import ParsedCall, ToolParser, arguments_text

_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    markers = (_TAG, "{")

    def find_start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith(_TAG) or stripped.startswith("{"):
            return len(text) - len(stripped)
        return None

    def hold_back(self, text: str) -> int:
        stripped = text.lstrip()
        if not stripped or _TAG.startswith(stripped):
            return len(text)  # only whitespace or a partial tag so far
        return 0

    def parse(self, section: str, final: bool) -> list[ParsedCall]:
        text = section.strip()
        if text.startswith(_TAG):
            text = text[len(_TAG):]
        decoder = json.JSONDecoder()
        calls, i = [], 0
        while i < len(text):
            while i < len(text) and text[i] in " \t\r\n;":
                i += 1
            if i >= len(text):
                break
            try:
                obj, i = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                if final and not calls:
                    raise ValueError("not a tool call") from None
                break  # incomplete (streaming) or trailing text
            if not isinstance(obj, dict) or "name" not in obj:
                raise ValueError("not a tool call")
            calls.append(ParsedCall(obj["name"], arguments_text(
                obj.get("parameters", obj.get("arguments", {})))))
        return calls
