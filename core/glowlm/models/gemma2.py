"""Gemma 2 (``Gemma2ForCausalLM``): Gemma 3's layers without q/k norms, with soft-capping.

transformers' ``modeling_gemma2``, as a :class:`~glowlm.models.decoder.DecoderSpec`
beside Gemma 3's (:mod:`glowlm.models.gemma3`):

- the same ``1 + w`` RMSNorms before and after each branch (``SANDWICH``), GeGLU MLP,
  embeddings times ``sqrt(hidden_size)`` rounded to the model dtype, tied head, the
  attention scale ``query_pre_attn_scalar ** -0.5``;
- no q/k norms; instead the attention scores are soft-capped,
  ``attn_logit_softcapping * tanh(s / attn_logit_softcapping)`` (the attention backend
  applies it: ``AttentionLayerSpec.logits_soft_cap``), and so are the logits
  (``final_logit_softcapping``);
- local and global layers alternate (``config.layer_types``: local layers attend within
  ``sliding_window``), all with one rotary table (``rope_theta``).

A layer with capped scores is outside the fused layer forms (their descriptions carry no
cap), so such layers run their modules; a config without ``attn_logit_softcapping``
keeps Gemma's ``"decoder"`` form.
"""

from __future__ import annotations

from glowlm.models.decoder import SANDWICH, DecoderLM, DecoderSpec, layer_types

GEMMA2 = DecoderSpec(
    norm="gemma_rms", norms=SANDWICH,
    query_scale=lambda config, head_size: float(config.query_pre_attn_scalar) ** -0.5,
    attn_softcap=lambda config: getattr(config, "attn_logit_softcapping", None),
    layer_types=layer_types,
    activation_keys=("hidden_activation", "hidden_act"),
    default_activation="gelu_pytorch_tanh", activations=None,
    embed_scale=lambda config: config.hidden_size ** 0.5, embed_scale_in_dtype=True,
    logit_softcap=lambda config: getattr(config, "final_logit_softcapping", None),
    tie_default=True, fused="decoder")


class Gemma2ForCausalLM(DecoderLM):
    family = GEMMA2
