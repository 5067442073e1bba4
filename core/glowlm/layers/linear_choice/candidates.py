"""What the linear choice chooses between, and how a layer dispatches on its winners.

A :class:`LinearCandidate` is one implementation of a linear layer; a
:class:`TokenClass` is a range of rows per call (decode, batched decode, prefill)
timed separately; :class:`ChosenLinearMethod` replaces a layer's method so each call
runs its token class's winner (see :mod:`glowlm.layers.linear_choice`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from glowlm.layers.linear import LinearMethod


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


def _always(layer: nn.Module) -> bool:
    return True


@dataclass(frozen=True)
class LinearCandidate:
    """One implementation of ``x @ W^T + b`` for a layer.

    ``apply(layer, x, bias)`` computes it from the layer's own parameters (a dense
    candidate reads ``layer.weight``; a quantized one its packed tensors), for ``x`` of
    shape ``[rows, in]``. ``version`` is part of the cache key: change it when the
    kernel changes (glowlm's holds its source hash). ``supports(layer)`` says whether
    it runs this layer at all. ``fused`` marks the kernel the platform's fused ops run
    (see the module docstring). ``finalize(layer)``, if given, runs once for each
    layer that uses only this candidate after the choice (e.g. a weight prepack that
    would break the other candidates). ``release(layer)``, if given, runs for each
    layer that does not use it (e.g. to drop a copy in its own layout made while
    measuring).
    """

    name: str
    version: str
    apply: Callable[[nn.Module, torch.Tensor, torch.Tensor | None], torch.Tensor]
    supports: Callable[[nn.Module], bool] = _always
    fused: bool = False
    finalize: Callable[[nn.Module], None] | None = None
    release: Callable[[nn.Module], None] | None = None
    prepare: Callable[[nn.Module], None] | None = None
    copy_bytes: Callable[[nn.Module], int] | None = None


def _torch_apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
                 ) -> torch.Tensor:
    return F.linear(x, layer.weight, bias)


def _dense(layer: nn.Module) -> bool:
    w = getattr(layer, "weight", None)
    return isinstance(w, torch.Tensor) and w.dim() == 2 and w.layout == torch.strided


#: torch's ``F.linear`` (oneDNN/MKL on x86: AVX512-BF16 and AMX where the CPU has them).
TORCH_LINEAR = LinearCandidate(
    "torch", f"{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}",
    _torch_apply, _dense)


_ONEDNN_DTYPES = (torch.bfloat16, torch.float32)


def _onednn_ops() -> tuple[Any, Any] | None:
    """(reorder, linear) from torch's oneDNN bindings, or ``None`` where this torch lacks
    them (a build without mkldnn)."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return (torch.ops.mkldnn._reorder_linear_weight, torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return None


def onednn_weight(layer: nn.Module) -> torch.Tensor:
    """``layer``'s weight in oneDNN's blocked layout: the weight itself once
    :func:`_onednn_finalize` replaced it, else a copy made on first use."""
    w = layer.weight
    if w.is_mkldnn:
        return w
    packed = layer.__dict__.get("onednn_weight")
    if packed is None:
        ops = _onednn_ops()
        assert ops is not None
        packed = ops[0](w.detach(), None)
        layer.__dict__["onednn_weight"] = packed
    return packed


def _onednn_apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
                  ) -> torch.Tensor:
    linear = torch.ops.mkldnn._linear_pointwise
    w = onednn_weight(layer)
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    y = linear(x2, w, bias, "none", [], "")
    return y.reshape(*x.shape[:-1], y.shape[-1])


def _onednn_supports(layer: nn.Module) -> bool:
    w = getattr(layer, "weight", None)
    return (isinstance(w, torch.Tensor) and w.dim() == 2 and w.dtype in _ONEDNN_DTYPES
            and (w.is_mkldnn or w.layout == torch.strided))


def _onednn_finalize(layer: nn.Module) -> None:
    """The layer runs oneDNN for every class: its packed weight replaces the plain
    one, so it holds one copy (its method's own ``apply`` can no longer run)."""
    packed = onednn_weight(layer)
    layer.weight = nn.Parameter(packed, requires_grad=False)
    layer.__dict__.pop("onednn_weight", None)


def _onednn_release(layer: nn.Module) -> None:
    layer.__dict__.pop("onednn_weight", None)


def _onednn_copy_bytes(layer: nn.Module) -> int:
    w = layer.weight
    return 0 if w.is_mkldnn else w.numel() * w.element_size()


#: torch's oneDNN GEMM on a weight reordered once into oneDNN's blocked layout (the
#: prepack ``F.linear`` redoes, or does without, on every call): 1.3-2x ``F.linear``
#: at 4-64 rows. Where it shares a layer with another candidate it keeps its own copy.
ONEDNN_LINEAR = LinearCandidate(
    "onednn", f"{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}",
    _onednn_apply, _onednn_supports, finalize=_onednn_finalize, release=_onednn_release,
    prepare=onednn_weight, copy_bytes=_onednn_copy_bytes)


def onednn_candidates() -> list[LinearCandidate]:
    """``[ONEDNN_LINEAR]`` where this torch has oneDNN's linear bindings, else ``[]``: a
    dense method lists it beside :data:`TORCH_LINEAR`."""
    return [ONEDNN_LINEAR] if _onednn_ops() is not None else []


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
