"""Llama and its close relatives: Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm).

Each is a :class:`~glowlm.models.decoder.DecoderSpec`: Llama's is the spec's defaults,
the others change one switch. The math, the fused paths and parallelism are the shared
decoder's (:mod:`glowlm.models.decoder`).
"""

from __future__ import annotations

from glowlm.models.decoder import DecoderLM, DecoderSpec

LLAMA = DecoderSpec()
#: q, k, v always biased, o never (Qwen2's attention ignores ``attention_bias``).
QWEN2 = DecoderSpec(qkv_bias=True, o_bias=False)
#: RMSNorm over each q and k head before rotary.
QWEN3 = DecoderSpec(qk_norm="head")


class LlamaForCausalLM(DecoderLM):
    family = LLAMA


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral's layers are Llama's; a config's ``sliding_window`` bounds the context
    instead (``resolve_max_model_len``), since these layers attend to all of it."""


class Qwen2ForCausalLM(DecoderLM):
    family = QWEN2


class Qwen3ForCausalLM(DecoderLM):
    family = QWEN3
