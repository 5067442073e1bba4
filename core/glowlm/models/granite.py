"""IBM Granite 3.x (``GraniteForCausalLM``): Llama's layers with four constant multipliers.

transformers' ``modeling_granite`` multiplies the embeddings by ``embedding_multiplier``,
each branch's output by ``residual_multiplier`` before it joins the residual, scales
attention by ``attention_multiplier`` (instead of ``head_dim ** -0.5``) and divides the
logits by ``logits_scaling``. They are declaration data here; the decoder is Llama's. A
residual multiplier other than 1 is outside the Llama fused form, so such layers run
their modules (checkpoints that leave it at 1 keep the fused paths).
"""

from __future__ import annotations

from glowlm.models.decoder import DecoderLM, DecoderSpec

GRANITE = DecoderSpec(
    query_scale=lambda config, head_size: float(config.attention_multiplier),
    embed_scale=lambda config: config.embedding_multiplier,
    residual_scale=lambda config: config.residual_multiplier,
    logits_divisor=lambda config: config.logits_scaling)


class GraniteForCausalLM(DecoderLM):
    family = GRANITE
