"""Tool-call parsers on the formats models really write (hermes, llama3_json, mistral,
qwen3_coder), whole and streamed piece by piece."""

from __future__ import annotations

import json

import pytest
from glowlm.entrypoints.openai.tool_parsers import (
    TOOL_PARSERS,
    StreamingToolState,
    get_tool_parser,
)
from glowlm.errors import ConfigError

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "metric": {"type": "boolean"},
                                     "hours": {"type": "array"}}}}}]

#: (parser, model text, expected content, expected [(name, arguments)])
CASES = [
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
               '</tool_call>', "Sure.", [("get_weather", {"city": "Paris"})]),
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n'
               '{"name": "b", "arguments": {"x": 1}}\n</tool_call>', None,
     [("a", {}), ("b", {"x": 1})]),
    ("hermes", "no tools here", "no tools here", []),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', None,
     [("get_weather", {"city": "Oslo"})]),
    ("llama3_json", '<|python_tag|>{"name": "a", "parameters": {"q": 1}}; '
                    '{"name": "b", "parameters": {}}', None, [("a", {"q": 1}), ("b", {})]),
    ("llama3_json", 'The answer is {"name": "x"}', 'The answer is {"name": "x"}', []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]', None,
     [("get_weather", {"city": "Rome"})]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}[TOOL_CALLS]b[ARGS]{}', None,
     [("get_weather", {"city": "Lyon"}), ("b", {})]),
    ("qwen3_coder", "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                    "San Francisco\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                    "<parameter=metric>\ntrue\n</parameter>\n<parameter=hours>\n[1, 2]\n"
                    "</parameter>\n</function>\n</tool_call>", "Checking.",
     [("get_weather", {"city": "San Francisco", "days": 3, "metric": True, "hours": [1, 2]})]),
]


@pytest.mark.parametrize("name,text,content,calls", CASES)
def test_extract(name: str, text: str, content: str | None,
                 calls: list[tuple[str, dict]]) -> None:
    parser = get_tool_parser(name)(TOOLS)
    out = parser.extract_tool_calls(text)
    assert out.tools_called == bool(calls)
    assert out.content == content
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == calls
    if name == "mistral" and calls:
        assert all(len(c.id) == 9 and c.id.isalnum() for c in out.tool_calls)


@pytest.mark.parametrize("name,text,content,calls", CASES)
def test_streamed_in_pieces_equals_whole(name: str, text: str, content: str | None,
                                         calls: list[tuple[str, dict]]) -> None:
    state = StreamingToolState(get_tool_parser(name)(TOOLS))
    got_content, got_calls = "", []
    for end in range(1, len(text) + 1):  # one character at a time: the worst case
        piece, new = state.update(text[:end], finished=end == len(text))
        got_content += piece
        got_calls += new
        if calls and end < len(text):  # no marker fragment ever leaks as content
            assert "<tool" not in got_content and "[TOOL" not in got_content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls
    assert got_content.strip() == (content or "") if calls else got_content == text


def test_registry_names() -> None:
    assert {"hermes", "llama3_json", "mistral", "qwen3_coder", "qwen3_xml"} <= set(TOOL_PARSERS)
    with pytest.raises(ConfigError, match="unknown"):
        get_tool_parser("nope")
