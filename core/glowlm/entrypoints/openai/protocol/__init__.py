"""OpenAI-compatible request models, one module per endpoint family.

- :mod:`.common`: the parsing rules (lax, unknown fields logged and ignored) and the
  sampling fields completions and chat completions share;
- :mod:`.completions`: ``/v1/completions``;
- :mod:`.chat`: ``/v1/chat/completions`` (messages, tools, tool choice);
- :mod:`.tokenize`: ``/tokenize`` and ``/detokenize``;
- :mod:`.lora`: ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``.

Every model is importable from here too (``from glowlm.entrypoints.openai.protocol
import ChatCompletionRequest``). The errors' shape is
:mod:`~glowlm.entrypoints.openai.errors`'s; the responses sent whole are
:mod:`~glowlm.entrypoints.openai.responses`'s.
"""

from glowlm.entrypoints.openai.protocol.chat import (
    ChatCompletionRequest,
    ChatMessage,
    ChatTool,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    TextPart,
)
from glowlm.entrypoints.openai.protocol.common import (
    JsonSchemaFormat,
    OpenAIModel,
    ResponseFormat,
    SamplingRequest,
    StreamOptions,
    StructuredOutputs,
    parse_request,
)
from glowlm.entrypoints.openai.protocol.completions import CompletionRequest
from glowlm.entrypoints.openai.protocol.lora import (
    LoadLoRAAdapterRequest,
    UnloadLoRAAdapterRequest,
)
from glowlm.entrypoints.openai.protocol.tokenize import DetokenizeRequest, TokenizeRequest

__all__ = ["ChatCompletionRequest", "ChatMessage", "ChatTool", "CompletionRequest",
           "DetokenizeRequest", "FunctionDefinition", "JsonSchemaFormat",
           "LoadLoRAAdapterRequest", "NamedFunction", "NamedToolChoice", "OpenAIModel",
           "ResponseFormat", "SamplingRequest", "StreamOptions", "StructuredOutputs",
           "TextPart", "TokenizeRequest", "UnloadLoRAAdapterRequest", "parse_request"]
