"""The token classes the linear choice times, and how a layer dispatches on its winners.

The candidates themselves (:class:`~glowlm.ops.linear.LinearCandidate`, torch's and
oneDNN's) are part of the linear interface in :mod:`glowlm.ops.linear`; a
:class:`TokenClass` is a range of rows per call (decode, batched decode, prefill)
timed separately; :class:`ChosenLinearMethod` replaces a layer's method so each call
runs its token class's winner (see :mod:`glowlm.layers.linear_choice`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from glowlm.ops.linear import LinearCandidate, LinearMethod


@dataclass(frozen=True)
class TokenClass:
    """A range of rows per linear call, timed at ``rows``; ``max_rows=None``: no bound.

    ``pass_layers``: how many layers of a shape one timed pass runs back to back. Decode
    is memory bound, so it streams several layers' weights (more than the caches
    hold, as the model does); the compute-bound classes need few.
    """

    name: str
    rows: int
    max_rows: int | None
    pass_layers: int = 1


#: Decode of one or two sequences, of a few (a server at concurrency ~8), batched decode
#: (~32 sequences), prefill chunks (hundreds of tokens). Bounds lie between the timed
#: row counts. "small" is its own class because the winners differ there: glowlm's
#: GEMV streams weights fastest at one row, while packed GEMMs already win at 4-8 rows
#: on an AVX512-BF16 host (docs/performance.md). "small" is timed at 8 rows, a server
#: at concurrency 8: timed at 6 it picked oneDNN, whose GEMM has a fast path at 6 rows
#: that it loses at 8 (16384 x 2048 bf16, Zen 4 guest: 2.3 ms at 6, 3.0-3.4 ms at 8).
TOKEN_CLASSES: tuple[TokenClass, ...] = (
    TokenClass("decode", 1, 2, pass_layers=8),
    TokenClass("small", 8, 16, pass_layers=4),
    TokenClass("batch", 32, 96, pass_layers=2),
    TokenClass("prefill", 256, None, pass_layers=1),
)


def token_class(rows: int, classes: Sequence[TokenClass] = TOKEN_CLASSES) -> TokenClass:
    for c in classes:
        if c.max_rows is None or rows <= c.max_rows:
            return c
    return classes[-1]


class ChosenLinearMethod:
    """A layer's method with its apply replaced by the per-class winners.

    Delegates everything else to the layer's original method (kept as ``inner``), so
    code that inspects ``layer.method`` for its type should look at ``inner``.
    """

    def __init__(self, inner: LinearMethod, impls: Sequence[tuple[int | None, LinearCandidate]]
                 ) -> None:
        self.inner = inner
        self.impls = tuple(impls)  # (max_rows, candidate) in class order

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)

    def for_rows(self, rows: int) -> LinearCandidate:
        for bound, cand in self.impls:
            if bound is None or rows <= bound:
                return cand
        return self.impls[-1][1]

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.dim() != 2 else x.shape[0]
        return self.for_rows(rows).apply(layer, x, bias)


class _ChosenHead:
    """An LM head's ``dense_linear(x, weight, bias)`` dispatched on its row count."""

    def __init__(self, head: nn.Module, method: ChosenLinearMethod) -> None:
        self.head, self.method = head, method

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                 ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        y = self.method.for_rows(x2.shape[0]).apply(self.head, x2, bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])


class _FusedGate:
    """A fused op that declines the token classes where a linear it covers chose another
    implementation (its first tensor argument's first dimension is the token count)."""

    def __init__(self, fn: Callable[..., Any], allowed: frozenset[str]) -> None:
        self.fn, self.allowed = fn, allowed

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        rows = next(a.shape[0] for a in args if isinstance(a, torch.Tensor))
        if token_class(rows).name not in self.allowed:
            return None
        return self.fn(*args, **kwargs)
