"""Quantization configs: from a checkpoint's ``quantization_config`` to linear methods.

A :class:`QuantizationConfig` subclass is registered under the ``quant_method``
name checkpoints use (``awq``, ``gptq``, ``compressed-tensors``) by a plugin's
``glowlm_quantization_configs`` hook. The engine looks the name up when it reads a
quantized checkpoint (no flag needed; ``--quantization`` only confirms or refuses);
an unknown name or one the platform does not declare is a clear error listing what
is available.

The format-generic parts live here, in core: parsing each format's config
(:mod:`.gptq`, :mod:`.awq`, :mod:`.compressed_tensors`), the linear methods that
declare the packed tensors exactly as the checkpoint stores them and turn them into
one canonical form after loading (:mod:`.schemes`), and a pure-PyTorch reference
of the matmuls (:mod:`.kernels`). A plugin subclasses a format's config to give it
its compiled :class:`~glowlm.layers.quantization.kernels.QuantKernels` and says which
platforms it serves (:meth:`QuantizationConfig.supports`): every plugin installs
everywhere, so several may register the same name, and the one serving the selected
platform is chosen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from glowlm.errors import ModelLoadError

if TYPE_CHECKING:
    from glowlm.layers.quantization.kernels import QuantKernels
    from glowlm.layers.quantization.moe import WeightOnlyMoEMethod
    from glowlm.ops.linear import LinearMethod
    from glowlm.platforms.interface import Platform


class QuantizationConfig:
    """Parsed quantization settings of one checkpoint."""

    #: The ``quantization_config.quant_method`` value this class handles.
    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self.platform: Platform | None = None

    @classmethod
    def supports(cls, platform: Platform) -> bool:
        """Whether this class serves ``platform`` (default: any platform declaring the name)."""
        return True

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> QuantizationConfig:
        """Parse the checkpoint's ``quantization_config`` dict; raise ModelLoadError if bad."""
        raise NotImplementedError

    def kernels(self) -> QuantKernels:
        """The matmuls the linear methods run (core's pure-PyTorch reference by default)."""
        from glowlm.layers.quantization.kernels import REFERENCE_KERNELS

        return REFERENCE_KERNELS

    def linear_method(self, prefix: str) -> LinearMethod | None:
        """The method for the linear layer at ``prefix``, or None to leave it dense."""
        raise NotImplementedError

    def moe_method(self, prefix: str) -> WeightOnlyMoEMethod | None:
        """The method of the experts of the MoE layer at ``prefix`` (``...mlp.experts``);
        None (the default) keeps them dense in the model dtype. GGUF runs its expert
        blocks natively (:mod:`glowlm.layers.quantization.moe`)."""
        return None

    def lm_head_method(self, prefix: str) -> LinearMethod | None:
        """The method of the LM head at ``prefix``; None (the default) keeps it dense.

        Only a format whose files store the head quantized says otherwise: GGUF (its
        ``output``/tied ``token_embd`` blocks). AWQ, GPTQ and compressed-tensors
        checkpoints keep a dense head, as their exporters write it. A method returned
        here must also have ``lookup(layer, ids)``: a tied embedding reads its rows from
        the head's quantized weight.
        """
        return None


def registry(plugins: object | None = None
             ) -> dict[str, list[tuple[str, type[QuantizationConfig]]]]:
    """``quant_method -> [(plugin name, class), ...]`` from every loaded plugin."""
    from glowlm import envs
    from glowlm.errors import PluginError
    from glowlm.plugins.manager import load_plugins

    pset = plugins or load_plugins(envs.get().plugins_block)
    found: dict[str, list[tuple[str, type[QuantizationConfig]]]] = {}
    for plugin, result in pset.hook_results("glowlm_quantization_configs"):  # type: ignore
        for cls in result or []:
            if not (isinstance(cls, type) and issubclass(cls, QuantizationConfig) and cls.name):
                raise PluginError(f"plugin {plugin.name!r}: glowlm_quantization_configs returned "
                                  f"{cls!r}, not a named QuantizationConfig subclass")
            found.setdefault(cls.name, []).append((plugin.name, cls))
    return found


def implemented(platform: Platform, plugins: object | None = None) -> list[str]:
    """The declared methods some installed plugin implements for ``platform``."""
    available = registry(plugins)
    return [m for m in platform.capabilities.quantization
            if any(cls.supports(platform) for _, cls in available.get(m, []))]


def resolve(hf_quant_config: dict[str, Any] | None, platform: Platform,
            requested: str | None = None) -> QuantizationConfig | None:
    """The quantization config for a checkpoint on ``platform`` (None if unquantized).

    ``requested`` is ``--quantization``: as in vLLM it must name the checkpoint's own
    method (the method always comes from the checkpoint); naming one for an
    unquantized checkpoint is an error, since glowlm does not quantize at load.
    """
    if requested is not None:
        requested = requested.lower()
        if not hf_quant_config:
            raise ModelLoadError(f"--quantization {requested}: the checkpoint is not quantized "
                                 "(it has no quantization_config); glowlm runs quantized "
                                 "checkpoints, it does not quantize at load")
    if not hf_quant_config:
        return None
    method = str(hf_quant_config.get("quant_method", "")).lower()
    if requested is not None and requested != method:
        raise ModelLoadError(f"--quantization {requested} does not match the checkpoint's "
                             f"quantization method {method!r}")
    declared = platform.capabilities.quantization
    if method not in declared:
        raise ModelLoadError(
            f"the checkpoint is quantized with {method!r}, which the {platform.name} platform "
            f"does not support (it supports: {', '.join(declared) or 'none'})")
    candidates = [(p, c) for p, c in registry().get(method, []) if c.supports(platform)]
    if not candidates:
        raise ModelLoadError(
            f"the {platform.name} platform declares {method!r} quantization but no installed "
            f"plugin implements it for that platform")
    if len(candidates) > 1:
        from glowlm.errors import PluginError

        raise PluginError(f"quantization method {method!r} on the {platform.name} platform is "
                          f"registered by both {candidates[0][0]!r} and {candidates[1][0]!r}")
    config = candidates[0][1].from_config(hf_quant_config)
    config.platform = platform
    return config
