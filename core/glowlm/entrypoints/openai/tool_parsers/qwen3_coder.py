"""Qwen3-Coder XML format (vLLM's ``qwen3_coder`` / ``qwen3_xml``)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Parameter values are text; they are converted by the tool's JSON schema
(integer, number, boolean, object/array as JSON), strings kept as written.
"""

from __future__ import annotations

import json
import re
from typing import Any

from glowlm.entrypoints.openai.tool_parsers.base import ParsedCall, ToolParser

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_FUNCTION_OPEN = re.compile(r"<function=([^>\n]+)>(.*)$", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def _convert(value: str, schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if value.lower() == "null" and ("null" in kinds or kind is None):
        return None
    try:
        if "integer" in kinds:
            return int(value)
        if "number" in kinds:
            number = float(value)
            return int(number) if number.is_integer() and "." not in value else number
        if "boolean" in kinds:
            if value.lower() in ("true", "false"):
                return value.lower() == "true"
        if "object" in kinds or "array" in kinds:
            return json.loads(value)
    except (ValueError, json.JSONDecodeError):
        pass
    if kind is None:  # unknown parameter: JSON if it reads as JSON, else text
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


class Qwen3CoderToolParser(ToolParser):
    markers = ("<tool_call>", "<function=")

    def parse(self, section: str, final: bool) -> list[ParsedCall]:
        bodies = [(m.group(1), m.group(2)) for m in _FUNCTION.finditer(section)]
        if final:
            tail = section[section.rfind("</function>") + 11:] if bodies else section
            m = _FUNCTION_OPEN.search(tail)
            if m:
                bodies.append((m.group(1), m.group(2)))
        calls = []
        for name, body in bodies:
            name = name.strip()
            props = self.schema_types(name)
            args = {}
            for p in _PARAM.finditer(body):
                key = p.group(1).strip()
                value = p.group(2)
                value = value[1:] if value.startswith("\n") else value
                value = value[:-1] if value.endswith("\n") else value
                args[key] = _convert(value, props.get(key, {}))
            calls.append(ParsedCall(name, json.dumps(args, ensure_ascii=False)))
        return calls
