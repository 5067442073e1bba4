"""Tool calling through ``glowlm serve``, as vLLM serves it, driven by the openai client.

One server (module scope) runs the tiny model with a hermes-style chat template,
``--enable-auto-tool-choice --tool-call-parser hermes``: the template receives the
tools, named and required tool choices are constrained to the tools' schemas, calls
stream as deltas, and with ``tool_choice`` auto the parser reads the model's
``<tool_call>`` text (the random model is driven into it with a regex).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from glowlm.testing.server import HERMES_TEMPLATE, openai_client, post, start_server, stop_server
from glowlm.testing.server import ServerProcess as Server
from glowlm.testing.tiny_models import make_tiny_model

MODEL = "tiny"
EXACT = {"ignore_eos": True}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Berlin"]},
                           "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city", "unit"], "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "integer",
                                                                 "minimum": -12,
                                                                 "maximum": 12}},
                       "required": ["zone"], "additionalProperties": False},
    },
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tool_calling")
    make_tiny_model("llama", root / "llama")
    (root / "hermes.jinja").write_text(HERMES_TEMPLATE)
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Server]:
    srv = start_server(
        root / "llama", root / "server.log", "--dtype", "float", "--max-model-len", "1K",
        "--block-size", "32", "--served-model-name", MODEL,
        "--chat-template", str(root / "hermes.jinja"),
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai_client(server)


def test_chat_template_receives_the_tools(root: Path, client: openai.OpenAI) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(root / "llama"))
    text = tok.apply_chat_template(USER, tools=[WEATHER], chat_template=HERMES_TEMPLATE,
                                   add_generation_prompt=True, tokenize=False)
    assert "get_weather" in text
    expected = len(tok.encode(text, add_special_tokens=False))
    out = client.chat.completions.create(model=MODEL, messages=USER,  # type: ignore
                                         tools=[WEATHER], tool_choice="none", max_tokens=1)
    assert out.usage is not None and out.usage.prompt_tokens == expected


def test_named_tool_round_trip(client: openai.OpenAI) -> None:
    """call -> tool message -> answer, as an agent framework runs it."""
    first = client.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER, TIME], max_tokens=40,  # type: ignore
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    msg = first.choices[0].message
    assert msg.tool_calls and len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.function.name == "get_weather" and call.id
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
               {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    answer = client.chat.completions.create(model=MODEL, messages=history,  # type: ignore
                                            tools=[WEATHER, TIME], tool_choice="none",
                                            max_tokens=5, extra_body=EXACT)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    assert answer.usage is not None and answer.usage.prompt_tokens > first.usage.prompt_tokens


@pytest.mark.parametrize("parallel", [True, False])
def test_required_tool_choice(server: Server, client: openai.OpenAI, parallel: bool) -> None:
    # The grammar allows "]" only after a whole call; the bias makes the random model
    # take it then, instead of adding calls until max_tokens.
    close = post(server, "/tokenize", {"prompt": "]", "add_special_tokens": False}).json()
    out = client.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER, TIME], tool_choice="required",  # type: ignore
        parallel_tool_calls=parallel, max_tokens=200, temperature=1.0, seed=2,
        logit_bias={str(close["tokens"][0]): 20})
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls or []
    assert calls and (parallel or len(calls) == 1)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])


def test_streamed_tool_call_deltas(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER], stream=True, max_tokens=40,  # type: ignore
        tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    args = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_choice_parses_hermes_calls(client: openai.OpenAI, stream: bool) -> None:
    """tool_choice auto: the server's hermes parser reads the model's <tool_call> text.
    The random model is driven into that text with a regex, as a real model would write it."""
    text = ('Let me check. <tool_call>{"name": "get_weather", "arguments": '
            '{"city": "Berlin", "unit": "C"}}</tool_call>')
    import re

    args: dict[str, Any] = dict(model=MODEL, messages=USER, tools=[WEATHER], max_tokens=400,
                                extra_body={"structured_outputs": {"regex": re.escape(text)}})
    if not stream:
        out = client.chat.completions.create(**args)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Let me check."
        calls = choice.message.tool_calls or []
    else:
        chunks = list(client.chat.completions.create(**args, stream=True))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert content.strip() == "Let me check." and "<tool" not in content
        calls = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments or "") == {"city": "Berlin", "unit": "C"}


def test_auto_tool_choice_without_parallel_calls_keeps_the_first(client: openai.OpenAI) -> None:
    import re

    text = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}'
            '</tool_call><tool_call>{"name": "get_weather", "arguments": {"city": "Berlin", '
            '"unit": "F"}}</tool_call>')
    args: dict[str, Any] = dict(model=MODEL, messages=USER, tools=[WEATHER], max_tokens=400,
                                extra_body={"structured_outputs": {"regex": re.escape(text)}})
    both = client.chat.completions.create(**args).choices[0].message.tool_calls or []
    one = client.chat.completions.create(**args, parallel_tool_calls=False)
    calls = one.choices[0].message.tool_calls or []
    assert len(both) == 2 and len(calls) == 1
    assert json.loads(calls[0].function.arguments)["city"] == "Paris"
