"""SmolLM3 (``SmolLM3ForCausalLM``): Llama's layers, some without rotary positions ("NoPE").

transformers' ``modeling_smollm3`` skips rotary on the layers ``config.no_rope_layers``
marks 0 (every 4th by default) and, with ``use_sliding_window``, attends within
``sliding_window`` on the layers ``config.layer_types`` marks sliding. Both are per-layer
data here; the decoder is Llama's. The Llama fused form needs rotary and no window, so
those layers run their modules and the rest keep the platform's fused layer op.
"""

from __future__ import annotations

from typing import Any

from glowlm.layers.rotary import rope_settings
from glowlm.models.decoder import (
    DecoderLM,
    DecoderSpec,
    RopeSettings,
    all_full,
    layer_types,
)


def _rope(config: Any, index: int, layer_type: str) -> RopeSettings:
    return rope_settings(config) if config.no_rope_layers[index] else None


def _layer_types(config: Any) -> list[str]:
    return layer_types(config) if getattr(config, "use_sliding_window", False) \
        else all_full(config)


SMOLLM3 = DecoderSpec(rope=_rope, layer_types=_layer_types)


class SmolLM3ForCausalLM(DecoderLM):
    family = SMOLLM3
