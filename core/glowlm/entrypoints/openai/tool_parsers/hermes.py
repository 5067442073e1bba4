"""Hermes format (NousResearch Hermes 2/3, Qwen2.5, Qwen3):
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call."""

from __future__ import annotations

import json
import re

from glowlm.entrypoints.openai.tool_parsers.base import ParsedCall, ToolParser, arguments_text

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class HermesToolParser(ToolParser):
    markers = ("<tool_call>",)

    def parse(self, section: str, final: bool) -> list[ParsedCall]:
        bodies = [m.group(1) for m in _BLOCK.finditer(section)]
        if final:  # a last block the model did not close (stopped at </tool_call> or EOS)
            tail = section[section.rfind("</tool_call>") + 12:] if bodies else section
            if tail.strip().startswith("<tool_call>"):
                bodies.append(tail.strip()[len("<tool_call>"):])
        calls = []
        for body in bodies:
            body = body.strip()
            if not body:
                continue
            obj = json.loads(body)
            calls.append(ParsedCall(obj["name"], arguments_text(
                obj.get("arguments", obj.get("parameters", {})))))
        return calls
