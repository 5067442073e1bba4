"""A layer's handle on its platform's fused layer op (see :mod:`glowlm.ops.fused`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from glowlm.layers.context import ModelParts

W = TypeVar("W")


class FusedLayer(Generic[W]):
    """The platform's fused op for one layer (``fn``, or None) and that layer's weights.

    Only unsharded, unquantized layers qualify: a fused op does the dense linears
    itself, so it would skip a tensor-parallel all-reduce or a quantized method.
    The weights are gathered on first use, after loading, from the parameters
    themselves (so weights moved into huge pages later are seen).
    """

    def __init__(self, fn: Callable[..., Any] | None, parts: ModelParts, applies: bool,
                 weights: Callable[[], W]) -> None:
        plain = parts.parallel.tp_size == 1 and parts.quant_config is None
        self.fn = fn if applies and plain else None
        self._make = weights
        self._weights: W | None = None

    def weights(self) -> W:
        if self._weights is None:
            self._weights = self._make()
        return self._weights
