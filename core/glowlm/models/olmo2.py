"""OLMo 2 (``Olmo2ForCausalLM``): Llama's parts with norms after the branches, not before.

transformers' ``modeling_olmo2`` normalises each branch's output
(``post_attention_layernorm``, ``post_feedforward_layernorm``) before it joins the
residual and has no norm before either branch, so attention and the MLP read the
residual stream itself; q and k are RMS-normed over the whole projection (all heads at
once) before rotary. Both are declaration data; the fused layer forms have neither, so
the layers run their modules. A projection-wide q/k norm needs every head's values, so
tensor parallelism is refused for now (pipeline parallelism is not affected).
"""

from __future__ import annotations

from glowlm.models.decoder import DecoderLM, DecoderSpec, NormPlacement

OLMO2 = DecoderSpec(
    norms=NormPlacement(pre_attn=None, post_attn="post_attention_layernorm", pre_mlp=None,
                        post_mlp="post_feedforward_layernorm"),
    qk_norm="projection", fused=None)


class Olmo2ForCausalLM(DecoderLM):
    family = OLMO2
