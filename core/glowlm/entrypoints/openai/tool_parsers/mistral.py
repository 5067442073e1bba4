"""Mistral format: ``[TOOL_CALLS]`` then either a JSON list of
``{"name", "arguments"}`` (tokenizer v3-v7) or ``name[ARGS]{...}`` per call
(v11+). Mistral's tool-call ids are 9 alphanumeric characters."""

from __future__ import annotations

import json
import random
import string

from glowlm.entrypoints.openai.tool_parsers.base import ParsedCall, ToolParser, arguments_text

_TAG = "[TOOL_CALLS]"
_ARGS = "[ARGS]"
_ALNUM = string.ascii_letters + string.digits


def mistral_id() -> str:
    return "".join(random.choices(_ALNUM, k=9))


class MistralToolParser(ToolParser):
    markers = (_TAG,)

    def parse(self, section: str, final: bool) -> list[ParsedCall]:
        decoder = json.JSONDecoder()
        calls: list[ParsedCall] = []
        for chunk in section.split(_TAG)[1:]:
            chunk = chunk.strip()
            if not chunk:
                continue
            if chunk[0] in "[{":
                try:
                    obj, _ = decoder.raw_decode(chunk)
                except json.JSONDecodeError:
                    if final:
                        raise ValueError("incomplete tool call") from None
                    break
                for item in obj if isinstance(obj, list) else [obj]:
                    calls.append(ParsedCall(item["name"], arguments_text(
                        item.get("arguments", item.get("parameters", {}))), id=mistral_id()))
                continue
            name, sep, rest = chunk.partition(_ARGS)
            if not sep:
                brace = chunk.find("{")
                if brace < 0:
                    if final:
                        raise ValueError("no arguments")
                    break
                name, rest = chunk[:brace], chunk[brace:]
            try:
                args, _ = decoder.raw_decode(rest.strip())
            except json.JSONDecodeError:
                if final:
                    raise ValueError("incomplete arguments") from None
                break
            calls.append(ParsedCall(name.strip(), arguments_text(args), id=mistral_id()))
        return calls
