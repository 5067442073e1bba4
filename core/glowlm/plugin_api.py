"""The public plugin API: everything a hardware backend or model plugin may import.

A plugin imports from this module only (its tests may also use ``glowlm.testing``
and the offline API, ``glowlm.LLM``/``SamplingParams``). Everything else in core is
private and may change in any release; what is here changes only with
:data:`PLUGIN_API_VERSION`: a new name bumps the minor version, a changed or removed
one the major version. A plugin declares the version it was built for as a literal
in its entry-point module::

    GLOWLM_PLUGIN_API = "1.1"

and discovery refuses a plugin whose major version differs or whose minor version
is newer than this glowlm's, with one line saying which to upgrade
(``glowlm platforms`` shows it). ``core/tests/test_plugin_api.py`` fails if an
in-tree plugin imports any other core module.

What is here, by concern:

- discovery: :data:`ENTRY_POINT_GROUP`, :data:`hookimpl` (hooks ``glowlm_platforms``,
  ``glowlm_settings``, ``glowlm_models``, ``glowlm_quantization_configs``);
- platforms: :class:`Platform`, :class:`Match`, :class:`Capabilities`, the host
  description (:class:`HostInfo`, :func:`from_dump`, :func:`live_host`), dtype names;
- parts: :class:`AttentionBackend` with :class:`AttentionMetadata` and
  :class:`AttentionLayerSpec`, :class:`LinearMethod` with the measured choice's
  :class:`LinearCandidate` (and :data:`TORCH_LINEAR`, :data:`ONEDNN_LINEAR` with
  :func:`onednn_candidates`; :func:`mapped_zeros` for a candidate's own copy of a
  weight in huge pages), :class:`OpsTable`, the fused
  layer contract (:class:`DecoderLayerWeights` and the OPT/GPT-2 and Llama-family
  forms), and core's references (:class:`ReferenceAttentionBackend`,
  :class:`UnquantizedLinearMethod`, :data:`REFERENCE_OPS`, :mod:`reference_ops`);
- settings: :class:`Setting` and its parsers, :func:`core_env` (core's variables);
- models: :func:`register_model`, :class:`CausalLM`, :class:`ModelParts`, and the
  building blocks core's models use (TP-ready linear layers, embedding and LM head,
  norms, rotary, activations, :class:`Attention`, :class:`FusedLayer` /
  :class:`FusedStack` with :func:`decoder_layer_op` / :func:`decoder_stack_op` for
  layers described as :class:`DecoderLayerWeights`);
- quantization: :class:`QuantizationConfig`, :func:`quantization_for_platform` (the
  checkpoint formats as configs of one platform), the kernel contract
  (:class:`QuantKernels`, :class:`WeightOnlyInt`, :class:`Int8Weights`,
  :class:`WeightOnlyParts`) and its reference (:data:`REFERENCE_QUANT_KERNELS`);
- logging and errors: :func:`init_logger`, :class:`ConfigError` and friends.
"""

from __future__ import annotations

from glowlm.attention.backend import (
    AttentionBackend,
    AttentionLayerSpec,
    AttentionMetadata,
    kv_bytes_per_token,
)
from glowlm.attention.reference import ReferenceAttentionBackend
from glowlm.envs import (
    Env,
    Setting,
    parse_bool,
    parse_choice,
    parse_int,
    parse_str,
)
from glowlm.errors import (
    ConfigError,
    GlowlmError,
    ModelLoadError,
    PlatformError,
    PluginError,
)
from glowlm.layers.activation import SiluAndMul
from glowlm.layers.attention import Attention
from glowlm.layers.context import ModelParts
from glowlm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from glowlm.layers.fused import FusedLayer, FusedStack, decoder_layer_op, decoder_stack_op
from glowlm.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from glowlm.layers.norm import LayerNorm, RMSNorm
from glowlm.layers.quantization import QuantizationConfig
from glowlm.layers.quantization.formats import for_platform as quantization_for_platform
from glowlm.layers.quantization.kernels import REFERENCE_KERNELS as REFERENCE_QUANT_KERNELS
from glowlm.layers.quantization.kernels import (
    Int8Weights,
    QuantKernels,
    WeightOnlyInt,
    WeightOnlyParts,
)
from glowlm.layers.rotary import RotaryEmbedding, rope_settings
from glowlm.logger import init_logger
from glowlm.models.base import CausalLM, prune_rows
from glowlm.models.registry import register_model
from glowlm.ops import reference as reference_ops
from glowlm.ops.fused import (
    DecoderLayerFn,
    DecoderLayerWeights,
    DecoderStackFn,
    LnDecoderLayerFn,
    LnDecoderStackFn,
    LnDecoderWeights,
    RmsDecoderLayerFn,
    RmsDecoderStackFn,
    RmsDecoderWeights,
    Rotary,
)
from glowlm.ops.linear import (
    ONEDNN_LINEAR,
    TORCH_LINEAR,
    LinearCandidate,
    LinearMethod,
    UnquantizedLinearMethod,
    onednn_candidates,
)
from glowlm.ops.table import REFERENCE_OPS, OpsTable
from glowlm.platforms.host import HostInfo, NumaNode, from_dump, from_files
from glowlm.platforms.interface import (
    DTYPE_NAMES,
    Capabilities,
    Match,
    Platform,
    dtype_name,
    parse_dtype,
)
from glowlm.plugins.hookspecs import API_ATTRIBUTE, PLUGIN_API_VERSION, hookimpl
from glowlm.plugins.manager import ENTRY_POINT_GROUP
from glowlm.runtime.hugepages import mapped_zeros


def live_host() -> HostInfo:
    """This machine as detectors see it, read now (``/proc/cpuinfo``, ``sysctl -a``).

    For what the *running* CPU executes (a platform may be built for a recorded
    host in tests, but must only load code this CPU runs).
    """
    from glowlm.platforms import host

    return host.live()


def core_env() -> Env:
    """Core's environment variables, parsed now (kernel cache, disabled kernels, ...)."""
    from glowlm import envs

    return envs.get()


__all__ = [
    "API_ATTRIBUTE", "DTYPE_NAMES", "ENTRY_POINT_GROUP", "ONEDNN_LINEAR", "PLUGIN_API_VERSION",
    "REFERENCE_OPS",
    "REFERENCE_QUANT_KERNELS", "TORCH_LINEAR", "Attention", "AttentionBackend",
    "AttentionLayerSpec", "AttentionMetadata", "Capabilities", "CausalLM",
    "ColumnParallelLinear", "ConfigError", "DecoderLayerFn", "DecoderLayerWeights",
    "DecoderStackFn", "Env", "FusedLayer", "FusedStack", "GlowlmError", "HostInfo",
    "Int8Weights", "LayerNorm", "LinearCandidate", "LinearMethod", "LnDecoderLayerFn",
    "LnDecoderStackFn", "LnDecoderWeights", "Match", "MergedColumnParallelLinear",
    "ModelLoadError", "ModelParts", "NumaNode", "OpsTable", "ParallelLMHead", "Platform",
    "PlatformError", "PluginError", "QKVParallelLinear", "QuantKernels", "QuantizationConfig",
    "RMSNorm", "ReferenceAttentionBackend", "ReplicatedLinear", "RmsDecoderLayerFn",
    "RmsDecoderStackFn", "RmsDecoderWeights", "Rotary", "RotaryEmbedding", "RowParallelLinear",
    "Setting", "SiluAndMul", "UnquantizedLinearMethod", "VocabParallelEmbedding",
    "WeightOnlyInt", "WeightOnlyParts", "core_env", "decoder_layer_op", "decoder_stack_op",
    "dtype_name",
    "from_dump", "from_files", "hookimpl", "init_logger", "kv_bytes_per_token", "live_host",
    "mapped_zeros",
    "onednn_candidates", "parse_bool", "parse_choice", "parse_dtype", "parse_int", "parse_str",
    "prune_rows",
    "quantization_for_platform", "reference_ops", "register_model", "rope_settings",
]
