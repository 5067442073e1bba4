"""Gemma 3, text only (``Gemma3ForCausalLM``): transformers' ``modeling_gemma3`` on paged KV.

A :class:`~glowlm.models.decoder.DecoderSpec`; what sets it apart from Llama:

- RMSNorm is ``x / rms(x) * (1 + w)`` in float32 (:class:`~glowlm.layers.norm.GemmaRMSNorm`
  keeps ``1 + w`` in float32, so the platform's plain ``rms_norm`` op computes it);
  four norms per layer: before and after attention, before and after the MLP, the
  "after" ones applied to the branch before it joins the residual (``SANDWICH``).
- q and k are RMS-normed over ``head_dim`` before rotary; the attention scale is
  ``query_pre_attn_scalar ** -0.5``, not ``head_dim ** -0.5``.
- Embeddings are multiplied by ``sqrt(hidden_size)`` rounded to the model dtype, as
  transformers does (bf16 turns sqrt(640) = 25.30 into 25.25).
- The MLP is GeGLU with the tanh GELU (``gelu_tanh_and_mul``).
- Layers are local (sliding window, ``rope_local_base_freq``, no scaling) or global
  (full attention, ``rope_theta`` and ``rope_scaling``), from ``config.layer_types``
  or every ``sliding_window_pattern``-th layer global; the window goes to the
  attention backend in the layer's spec.
- ``final_logit_softcapping``, when the config sets it, caps the logits
  (``cap * tanh(logits / cap)``), as transformers does. ``attn_logit_softcapping`` is
  read by transformers' Gemma 3 but never applied (its attention call passes no
  ``softcap``; Gemma 3 replaced Gemma 2's attention soft-cap by the q/k norms), and
  vLLM's Gemma 3 passes none either, so a config that sets it gets a warning and the
  same attention as transformers; both are unset in Google's Gemma 3 configs.
- Embeddings are tied to the LM head.

Its layers describe themselves as :class:`~glowlm.ops.fused.DecoderLayerWeights` (the
``"decoder"`` fused form: the branch norms as ``post_norm1/2``, each layer's rotary
table, its window, its quantized projections), and the model runs every layer in one
platform call when the platform offers a ``decoder_stack`` that takes them (x86:
``gemma_decoder_stack``), layer by layer with its ``decoder_layer`` when the stack
declines a step, and its modules otherwise; the modules define the result and the fused
ops match them bit for bit. Gemma's layers fit neither the LayerNorm nor the Llama form
(``as_ln`` / ``as_rms``), so only a platform's own decoder ops run them. An op honours
each layer's window (x86's attends it in its paged attention kernel) or declines the
steps it would hide keys in; tensor parallelism keeps the modules (FusedLayer).
"""

from __future__ import annotations

from typing import Any

from glowlm.errors import ModelLoadError
from glowlm.logger import init_logger
from glowlm.models.decoder import (
    FULL,
    SANDWICH,
    SLIDING,
    DecoderLM,
    DecoderSpec,
    layer_types,
    local_global_rope,
    rope_for,
)

__all__ = ["FULL", "GEMMA3", "SLIDING", "Gemma3ForCausalLM", "layer_types", "rope_for"]

logger = init_logger(__name__)


def _check(config: Any) -> None:
    if getattr(config, "use_bidirectional_attention", False):
        raise ModelLoadError("Gemma 3 with use_bidirectional_attention (an embedding "
                             "model) is not a causal LM; glowlm serves causal Gemma 3 only")
    if getattr(config, "attn_logit_softcapping", None) is not None:
        logger.warning("config sets attn_logit_softcapping=%s; Gemma 3 does not apply it "
                       "(transformers' and vLLM's Gemma 3 neither)",
                       config.attn_logit_softcapping)


GEMMA3 = DecoderSpec(
    norm="gemma_rms", norms=SANDWICH, qk_norm="head",
    query_scale=lambda config, head_size: float(config.query_pre_attn_scalar) ** -0.5,
    layer_types=layer_types, rope=local_global_rope,
    activation_keys=("hidden_activation", "hidden_act"),
    default_activation="gelu_pytorch_tanh", activations=None,
    embed_scale=lambda config: config.hidden_size ** 0.5, embed_scale_in_dtype=True,
    logit_softcap=lambda config: getattr(config, "final_logit_softcapping", None),
    tie_default=True, fused="decoder", check=_check)


class Gemma3ForCausalLM(DecoderLM):
    family = GEMMA3
