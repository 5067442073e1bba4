"""Llama and its close relatives: Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm).

Each is a :class:`~glowlm.models.decoder.DecoderSpec`: Llama's is the spec's defaults,
the others change one switch. The math, the fused paths and parallelism are the shared
decoder's (:mod:`glowlm.models.decoder`).
"""

from __future__ import annotations

from glowlm.models.decoder import DecoderLM, DecoderSpec
from glowlm.models.spec import sliding_if_set, windowed_layers

LLAMA = DecoderSpec()
#: Llama's layers, each within ``sliding_window`` when the config sets one (v0.1's 4096).
MISTRAL = DecoderSpec(layer_types=sliding_if_set)
#: q, k, v always biased, o never (Qwen2's attention ignores ``attention_bias``); layers
#: from ``max_window_layers`` on slide when ``use_sliding_window`` is set.
QWEN2 = DecoderSpec(qkv_bias=True, o_bias=False, layer_types=windowed_layers)
#: RMSNorm over each q and k head before rotary.
QWEN3 = DecoderSpec(qk_norm="head")


class LlamaForCausalLM(DecoderLM):
    family = LLAMA


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral's layers are Llama's, attending within ``sliding_window`` when the config
    sets one: the context is not bounded by the window, and the blocks behind it go back
    to the pool (``BlockManager.slide``)."""

    family = MISTRAL


class Qwen2ForCausalLM(DecoderLM):
    family = QWEN2


class Qwen3ForCausalLM(DecoderLM):
    family = QWEN3
