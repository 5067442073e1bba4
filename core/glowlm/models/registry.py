"""Architecture name (``config.architectures[0]``) -> model class, imported late."""

from __future__ import annotations

import importlib

from glowlm.errors import ModelLoadError

_MODELS: dict[str, str] = {
    "LlamaForCausalLM": "glowlm.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "glowlm.models.llama:MistralForCausalLM",
    "Qwen2ForCausalLM": "glowlm.models.llama:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "glowlm.models.llama:Qwen3ForCausalLM",
    "OPTForCausalLM": "glowlm.models.opt:OPTForCausalLM",
    "GPT2LMHeadModel": "glowlm.models.gpt2:GPT2LMHeadModel",
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def model_class(architectures: list[str] | None) -> type:
    for arch in architectures or []:
        if arch in _MODELS:
            module, _, name = _MODELS[arch].partition(":")
            return getattr(importlib.import_module(module), name)
    raise ModelLoadError(
        f"unsupported architecture {', '.join(architectures or ['(none in config.json)'])}; "
        f"supported: {', '.join(supported_architectures())}")
