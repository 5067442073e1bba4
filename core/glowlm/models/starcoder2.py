"""Starcoder2 (``Starcoder2ForCausalLM``): LayerNorms, biases and a plain GELU MLP.

transformers' ``modeling_starcoder2`` keeps Llama's layer order (a norm before each
branch, rotary q/k) and changes its parts, each a declaration switch here:

- LayerNorm with a bias (``norm="layer"``) and ``norm_epsilon`` for every norm;
- q/k/v, o and both MLP projections biased by ``use_bias``;
- the MLP is ``c_proj(gelu_tanh(c_fc(x)))`` (``mlp="plain"``), not gated;
- ``sliding_window``, when set, bounds every layer's attention;
- embeddings tied to the head by default.

No fused layer form describes LayerNorm with rotary attention, so the layers run their
modules (each projection still on the measured linear choice).
"""

from __future__ import annotations

from typing import Any

from glowlm.models.decoder import LLAMA_STACKED, DecoderLM, DecoderSpec
from glowlm.models.spec import sliding_if_set


def _norm_epsilon(config: Any) -> float:
    return float(config.norm_epsilon)


STARCODER2 = DecoderSpec(
    norm="layer", norm_eps=_norm_epsilon, bias_key="use_bias", mlp="plain",
    default_activation="gelu_pytorch_tanh", activations=None,
    layer_types=sliding_if_set, tie_default=True, stacked=LLAMA_STACKED[:3], fused=None)


class Starcoder2ForCausalLM(DecoderLM):
    family = STARCODER2
