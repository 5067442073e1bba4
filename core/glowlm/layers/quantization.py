"""Quantization configs: from a checkpoint's ``quantization_config`` to linear methods.

A :class:`QuantizationConfig` subclass is registered under the
``quant_method`` name checkpoints use (``awq``, ``gptq``, ``compressed-tensors``)
by a plugin's ``glowlm_quantization_configs`` hook. The engine looks the name
up when it reads a quantized checkpoint; an unknown name or one the platform
does not declare is a clear error listing what is available.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from glowlm.errors import ModelLoadError

if TYPE_CHECKING:
    from glowlm.layers.linear import LinearMethod
    from glowlm.platforms.interface import Platform


class QuantizationConfig:
    """Parsed quantization settings of one checkpoint."""

    #: The ``quantization_config.quant_method`` value this class handles.
    name: ClassVar[str] = ""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> QuantizationConfig:
        """Parse the checkpoint's ``quantization_config`` dict; raise ModelLoadError if bad."""
        raise NotImplementedError

    def linear_method(self, prefix: str) -> LinearMethod | None:
        """The method for the linear layer at ``prefix``, or None to leave it dense."""
        raise NotImplementedError


def registry(plugins: object | None = None) -> dict[str, tuple[str, type[QuantizationConfig]]]:
    """``quant_method -> (plugin name, class)`` from every loaded plugin."""
    from glowlm import envs
    from glowlm.errors import PluginError
    from glowlm.plugins.manager import load_plugins

    pset = plugins or load_plugins(envs.get().plugins_block)
    found: dict[str, tuple[str, type[QuantizationConfig]]] = {}
    for plugin, result in pset.hook_results("glowlm_quantization_configs"):  # type: ignore
        for cls in result or []:
            if not (isinstance(cls, type) and issubclass(cls, QuantizationConfig) and cls.name):
                raise PluginError(f"plugin {plugin.name!r}: glowlm_quantization_configs returned "
                                  f"{cls!r}, not a named QuantizationConfig subclass")
            if cls.name in found:
                raise PluginError(f"quantization method {cls.name!r} is registered by both "
                                  f"{found[cls.name][0]!r} and {plugin.name!r}")
            found[cls.name] = (plugin.name, cls)
    return found


def resolve(hf_quant_config: dict[str, Any] | None, platform: Platform
            ) -> QuantizationConfig | None:
    """The quantization config for a checkpoint on ``platform`` (None if unquantized)."""
    if not hf_quant_config:
        return None
    method = str(hf_quant_config.get("quant_method", "")).lower()
    declared = platform.capabilities.quantization
    if method not in declared:
        raise ModelLoadError(
            f"the checkpoint is quantized with {method!r}, which the {platform.name} platform "
            f"does not support (it supports: {', '.join(declared) or 'none'})")
    available = registry()
    if method not in available:
        raise ModelLoadError(
            f"the {platform.name} platform declares {method!r} quantization but no installed "
            f"plugin implements it yet (implemented: {', '.join(sorted(available)) or 'none'})")
    return available[method][1].from_config(hf_quant_config)
