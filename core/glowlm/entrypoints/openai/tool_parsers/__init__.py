"""Tool-call parsers: read the tool calls a model wrote in its own format.

One module per format, registered by the name ``--tool-call-parser`` takes
(vLLM's names): ``hermes`` (also Qwen2.5 / Qwen3, which write hermes
``<tool_call>`` JSON), ``llama3_json``, ``mistral``, ``qwen3_coder`` /
``qwen3_xml`` (Qwen3-Coder's XML-style parameters).
"""

from __future__ import annotations

from glowlm.entrypoints.openai.tool_parsers.base import (
    ExtractedToolCalls,
    ParsedCall,
    StreamingToolState,
    ToolParser,
)
from glowlm.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from glowlm.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from glowlm.entrypoints.openai.tool_parsers.mistral import MistralToolParser
from glowlm.entrypoints.openai.tool_parsers.qwen3_coder import Qwen3CoderToolParser
from glowlm.errors import ConfigError

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama4_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "qwen3_xml": Qwen3CoderToolParser,
}


def get_tool_parser(name: str) -> type[ToolParser]:
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ConfigError(f"--tool-call-parser {name}: unknown; choose from "
                          f"{', '.join(sorted(TOOL_PARSERS))}") from None


__all__ = ["TOOL_PARSERS", "ExtractedToolCalls", "ParsedCall", "StreamingToolState",
           "ToolParser", "get_tool_parser"]
