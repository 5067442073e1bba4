"""A layer's handle on its platform's fused layer op (see :mod:`glowlm.ops.fused`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from glowlm.attention.backend import AttentionLayerSpec, AttentionMetadata
from glowlm.layers.context import ModelParts
from glowlm.ops.fused import LnDecoderWeights

#: ``config.activation_function`` -> the fused layer op's name for that activation
#: (the same functions :class:`glowlm.layers.activation.Activation` picks).
FUSED_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
                     "gelu_pytorch_tanh": "gelu_tanh"}


class FusedLnDecoder:
    """Runs a pre-LayerNorm decoder layer as one platform call, when it can.

    Only unsharded, unquantized layers qualify: the fused op does the dense
    linears itself, so it would skip a tensor-parallel all-reduce or a quantized
    method. Calling returns ``None`` when the layer must run its modules.
    """

    def __init__(self, parts: ModelParts, applies: bool,
                 weights: Callable[[], LnDecoderWeights]) -> None:
        plain = parts.parallel.tp_size == 1 and parts.quant_config is None
        self.fn = parts.ops.ln_decoder_layer if applies and plain else None
        self._make = weights
        self._weights: LnDecoderWeights | None = None

    def __call__(self, x: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                 spec: AttentionLayerSpec) -> torch.Tensor | None:
        if self.fn is None:
            return None
        if self._weights is None:  # after loading: the parameters exist by now
            self._weights = self._make()
        return self.fn(x, self._weights, kv_cache, metadata, spec)
