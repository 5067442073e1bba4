"""Architecture name (``config.architectures[0]``) -> model class, imported late.

The registry is open: core's families are listed in ``_MODELS``; a plugin adds its
own through the ``glowlm_models`` hook (found when a checkpoint is resolved, like
platforms), and code that embeds glowlm can call :func:`register_model` (vLLM's
``ModelRegistry.register_model`` for out-of-tree models). An architecture has one
owner: registering a name core or another plugin already provides is an error
naming both.
"""

from __future__ import annotations

import importlib

from glowlm.errors import ModelLoadError, PluginError

_MODELS: dict[str, str] = {
    "LlamaForCausalLM": "glowlm.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "glowlm.models.llama:MistralForCausalLM",
    "Qwen2ForCausalLM": "glowlm.models.llama:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "glowlm.models.llama:Qwen3ForCausalLM",
    "OPTForCausalLM": "glowlm.models.opt:OPTForCausalLM",
    "GPT2LMHeadModel": "glowlm.models.gpt2:GPT2LMHeadModel",
    "Gemma3ForCausalLM": "glowlm.models.gemma3:Gemma3ForCausalLM",
    "GraniteForCausalLM": "glowlm.models.granite:GraniteForCausalLM",
    "SmolLM3ForCausalLM": "glowlm.models.smollm3:SmolLM3ForCausalLM",
    "Olmo2ForCausalLM": "glowlm.models.olmo2:Olmo2ForCausalLM",
    "Phi3ForCausalLM": "glowlm.models.phi3:Phi3ForCausalLM",
    "Gemma2ForCausalLM": "glowlm.models.gemma2:Gemma2ForCausalLM",
    "Starcoder2ForCausalLM": "glowlm.models.starcoder2:Starcoder2ForCausalLM",
    "Qwen3MoeForCausalLM": "glowlm.models.moe:Qwen3MoeForCausalLM",
    "Qwen2MoeForCausalLM": "glowlm.models.moe:Qwen2MoeForCausalLM",
    "MixtralForCausalLM": "glowlm.models.moe:MixtralForCausalLM",
    "OlmoeForCausalLM": "glowlm.models.moe:OlmoeForCausalLM",
    # Pooling models (embeddings, scores): docs/pooling.md.
    "BertModel": "glowlm.models.bert:BertModel",
    "BertForSequenceClassification": "glowlm.models.bert:BertForSequenceClassification",
    "XLMRobertaModel": "glowlm.models.bert:XLMRobertaModel",
    "XLMRobertaForSequenceClassification":
        "glowlm.models.bert:XLMRobertaForSequenceClassification",
    "ModernBertModel": "glowlm.models.modernbert:ModernBertModel",
    "ModernBertForSequenceClassification":
        "glowlm.models.modernbert:ModernBertForSequenceClassification",
    "Qwen3Model": "glowlm.models.pooling:Qwen3Model",
    "Qwen2Model": "glowlm.models.pooling:Qwen2Model",
    "Qwen3ForSequenceClassification": "glowlm.models.pooling:Qwen3ForSequenceClassification",
    "Qwen2ForSequenceClassification": "glowlm.models.pooling:Qwen2ForSequenceClassification",
}


#: Registered at run time by :func:`register_model`: architecture -> (owner, target).
_REGISTERED: dict[str, tuple[str, str | type]] = {}


def register_model(architecture: str, model: str | type, owner: str = "register_model"
                   ) -> None:
    """Make ``architecture`` load as ``model`` (a ``"module:Class"`` string or the class).

    An architecture already provided by core, a plugin or an earlier call is a
    :class:`~glowlm.errors.PluginError` naming both owners.
    """
    if not isinstance(model, str | type) or (isinstance(model, str) and ":" not in model):
        raise PluginError(f"{owner}: model for {architecture!r} must be a 'module:Class' "
                          f"string or a class, got {model!r}")
    current = _owner(architecture)
    if current is not None and current != owner:
        raise PluginError(f"architecture {architecture!r} is provided by both {current!r} "
                          f"and {owner!r}")
    _REGISTERED[architecture] = (owner, model)


def _owner(architecture: str) -> str | None:
    if architecture in _MODELS:
        return "glowlm"
    if architecture in _REGISTERED:
        return _REGISTERED[architecture][0]
    return None


def plugin_models(plugins: object | None = None) -> dict[str, tuple[str, str | type]]:
    """``architecture -> (plugin name, model)`` from every loaded plugin's hook."""
    from glowlm import envs
    from glowlm.plugins.manager import load_plugins

    pset = plugins or load_plugins(envs.get().plugins_block)
    found: dict[str, tuple[str, str | type]] = {}
    for plugin, result in pset.hook_results("glowlm_models"):  # type: ignore[attr-defined]
        if not isinstance(result, dict):
            raise PluginError(f"plugin {plugin.name!r}: glowlm_models returned {result!r}, "
                              "not a dict of architecture -> 'module:Class'")
        for arch, model in result.items():
            owner = found[arch][0] if arch in found else _owner(arch)
            if owner is not None:
                raise PluginError(f"architecture {arch!r} is provided by both {owner!r} "
                                  f"and plugin {plugin.name!r}")
            if not isinstance(model, str | type) or (isinstance(model, str)
                                                     and ":" not in model):
                raise PluginError(f"plugin {plugin.name!r}: model for {arch!r} must be a "
                                  f"'module:Class' string or a class, got {model!r}")
            found[arch] = (plugin.name, model)
    return found


def _all_models(plugins: object | None = None) -> dict[str, tuple[str, str | type]]:
    out: dict[str, tuple[str, str | type]] = {a: ("glowlm", t) for a, t in _MODELS.items()}
    out.update(_REGISTERED)
    out.update(plugin_models(plugins))
    return out


def supported_architectures(plugins: object | None = None) -> list[str]:
    return sorted(_all_models(plugins))


def model_class(architectures: list[str] | None, plugins: object | None = None) -> type:
    models = _all_models(plugins)
    for arch in architectures or []:
        if arch in models:
            owner, target = models[arch]
            if isinstance(target, type):
                return target
            module, _, name = target.partition(":")
            try:
                return getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError) as exc:
                raise ModelLoadError(f"architecture {arch!r} (from {owner!r}) cannot be "
                                     f"imported from {target!r}: {exc}") from None
    raise ModelLoadError(
        f"unsupported architecture {', '.join(architectures or ['(none in config.json)'])}; "
        f"supported: {', '.join(sorted(models))}")
