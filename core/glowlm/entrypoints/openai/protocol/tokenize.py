"""vLLM's ``/tokenize`` and ``/detokenize`` requests."""

from __future__ import annotations

from glowlm.entrypoints.openai.protocol.chat import ChatMessage
from glowlm.entrypoints.openai.protocol.common import OpenAIModel


class TokenizeRequest(OpenAIModel):
    """vLLM's /tokenize: either a prompt or chat messages (rendered by the template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[int]
