"""Phi-3 / Phi-3.5 / Phi-4 (``Phi3ForCausalLM``): Llama's layers, fused tensors, LongRoPE.

transformers' ``modeling_phi3`` is Llama's decoder with three differences, all data here:

- the checkpoint stores q|k|v as one ``qkv_proj`` and gate|up as one ``gate_up_proj``,
  which are glowlm's own parameter names: each loads whole (split into its projections
  by the linear's loader under tensor parallelism, :meth:`CausalLM.load_weights`);
- the rotary scaling is usually ``longrope`` (``short_factor`` / ``long_factor`` around
  ``original_max_position_embeddings``, :mod:`glowlm.layers.rope_scaling` says which set
  a context takes), and Phi-4-mini rotates only ``partial_rotary_factor`` of each head;
- ``sliding_window``, when set, bounds every layer's attention (Phi-3-mini-4k's 2047);
  a window at least as long as the served context is dropped, so those layers keep the
  Llama fused form.
"""

from __future__ import annotations

from glowlm.models.decoder import DecoderLM, DecoderSpec
from glowlm.models.spec import sliding_if_set

PHI3 = DecoderSpec(layer_types=sliding_if_set)


class Phi3ForCausalLM(DecoderLM):
    family = PHI3
