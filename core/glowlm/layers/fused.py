"""A layer's handle on its platform's fused layer op (see :mod:`glowlm.ops.fused`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch

from glowlm.attention.backend import AttentionLayerSpec
from glowlm.distributed.shm import RankFailure
from glowlm.layers.context import ModelParts
from glowlm.ops.fused import generic_layer_op, generic_stack_op
from glowlm.ops.table import OpsTable

W = TypeVar("W")


class FusedLayer(Generic[W]):
    """The platform's fused op for one layer (``fn``, or None) and that layer's weights.

    Tensor-parallel shards qualify only for an op that says it runs them
    (``fn.accepts_tensor_parallel``: it gets the TP group in the weights and does the
    all-reduces itself); any other op does the linears itself and would skip them.
    Quantized layers qualify only for an op that
    says it runs quantized projections (``fn.accepts_quantized``; it gets their
    prepared weights and declines forms it does not know); any other op would bypass
    the quantized method. The weights are gathered on first use, after loading, from
    the parameters themselves (so weights moved into huge pages later are seen).
    """

    def __init__(self, fn: Callable[..., Any] | None, parts: ModelParts, applies: bool,
                 weights: Callable[[], W], window: int | None = None) -> None:
        """``window``: the layer's attention window when its op attends to the whole
        context (a form without per-layer windows): the op then runs only in steps
        whose every sequence fits the window, where the window hides no key (:meth:`fits`)."""
        sharded = parts.parallel.tp_size > 1
        plain = (not sharded or getattr(fn, "accepts_tensor_parallel", False)) and (
            parts.quant_config is None or getattr(fn, "accepts_quantized", False))
        self.fn = fn if applies and plain else None
        #: admitted with quantized projections (the stack over it must accept them too)
        self.quantized = self.fn is not None and parts.quant_config is not None
        #: the TP group of admitted shards (the stack over it must accept them too)
        self.tp_group = parts.parallel.tp_group if self.fn is not None and sharded else None
        self._make = weights
        self._weights: W | None = None
        #: Adapter rows in a step need the module-by-module path (the op runs the dense
        #: projections itself), so the op runs only in steps without them.
        self._lora = parts.lora
        self.window = window

    def fits(self, metadata: Any) -> bool:
        """Whether the op's full attention equals the layer's windowed one this step: no
        sequence is longer than the window (a query at q sees keys p > q - window)."""
        return self.window is None or metadata.max_seq_len <= self.window

    @property
    def runs(self) -> bool:
        """Whether this step may call :attr:`fn`."""
        return self.fn is not None and (self._lora is None or not self._lora.active)

    def weights(self) -> W:
        if self._weights is None:
            self._weights = self._make()
        return self._weights


class FusedStack(Generic[W]):
    """The platform's stack op over a model's layers, when every layer has its fused op.

    ``fused`` holds each layer's :class:`FusedLayer` and ``attention`` each layer's
    attention (for its cache index and spec), in layer order. ``skip_last=True`` runs
    all but the last layer (for a model that runs its last layer itself, on fewer
    rows: :meth:`glowlm.models.base.CausalLM.forward`).

    ``per_layer_window=True``: the layers' weights carry their own attention window
    (:attr:`glowlm.ops.fused.DecoderLayerWeights.sliding_window`, Gemma 3's local and
    global layers), so layers whose specs differ only in the window still make one
    call, with the common spec without a window. Otherwise the op attends to the whole
    context, so over layers with windows it runs only in steps that fit the smallest
    (Mistral, Phi-3: within the window, full attention is the windowed one) and the
    layers run their modules, whose backend slides, in longer steps.
    """

    def __init__(self, fn: Callable[..., Any] | None, fused: Sequence[FusedLayer[W]],
                 attention: Sequence[Any], per_layer_window: bool = False) -> None:
        self.fn = fn if fused and all(f.fn is not None for f in fused) else None
        if any(f.quantized for f in fused) and not getattr(fn, "accepts_quantized", False):
            self.fn = None  # layers admitted as quantized need a stack that runs them too
        self._tp_group = next((f.tp_group for f in fused if f.tp_group is not None), None)
        if self._tp_group is not None and not getattr(fn, "accepts_tensor_parallel", False):
            self.fn = None  # and shards one that does their all-reduces
        self._fused = list(fused)
        self._indices = [a.layer_index for a in attention]
        windows = [a.spec.sliding_window for a in attention if a.spec.sliding_window]
        #: the longest step the op may run (None: any); see the class docstring
        self._fits = None if per_layer_window or not windows else min(windows)
        specs = [dataclasses.replace(a.spec, sliding_window=None) for a in attention]
        self.spec: AttentionLayerSpec | None = specs[0] if specs else None
        if any(s != self.spec for s in specs):
            self.fn = None  # one call takes one spec
        self._weights: list[W] | None = None
        self._head: list[W] | None = None  # all but the last layer's
        self._lora = next((f._lora for f in fused if getattr(f, "_lora", None) is not None),
                          None)

    def weights(self, skip_last: bool = False) -> list[W]:
        """The layers' weights; the lists keep their identity (platforms key caches on it)."""
        if self._weights is None:
            self._weights = [f.weights() for f in self._fused]
            self._head = self._weights[:-1]
        assert self._head is not None
        return self._head if skip_last else self._weights

    def __call__(self, *args: Any, kv_caches: Sequence[torch.Tensor], metadata: Any,
                 skip_last: bool = False) -> Any:
        """``fn(*args, weights, caches, metadata, spec)``; None if absent or declined."""
        if self.fn is None or (skip_last and len(self._fused) == 1) or (
                self._lora is not None and self._lora.active) or (
                self._fits is not None and metadata.max_seq_len > self._fits):
            return None
        try:
            return self.fn(*args, self.weights(skip_last), self.caches(kv_caches, skip_last),
                           metadata, self.spec)
        except RuntimeError:
            # A compiled all-reduce raises a plain error when the group is stopped (a rank
            # died): make it the failure the engine and the workers handle.
            if self._tp_group is not None and getattr(self._tp_group, "aborted", False):
                raise RankFailure(self._tp_group.dead_reason) from None
            raise

    def caches(self, kv_caches: Sequence[torch.Tensor], skip_last: bool = False
               ) -> list[torch.Tensor]:
        indices = self._indices[:-1] if skip_last else self._indices
        return [kv_caches[i] for i in indices]


def projection_weights(projs: Sequence[Any]) -> tuple[list[torch.Tensor], tuple[Any, ...] | None]:
    """A fused layer's projection weights: each dense weight, or an empty placeholder where
    the projection is quantized, and the quantized ones' prepared forms
    (``layer.quant_weight``, None where dense; None altogether when all are dense), as
    the descriptions' ``*_weight`` and ``quant`` fields take them. Only ops that accept
    quantized layers are given such weights (:class:`FusedLayer`)."""
    quant = tuple(getattr(p, "quant_weight", None) for p in projs)
    weights = [torch.empty(0) if q is not None else p.weight
               for p, q in zip(projs, quant, strict=True)]
    return weights, quant if any(q is not None for q in quant) else None


def decoder_layer_op(ops: OpsTable) -> Callable[..., Any] | None:
    """The platform's per-layer op for :class:`~glowlm.ops.fused.DecoderLayerWeights`
    layers: its ``decoder_layer``, else its LayerNorm/RMSNorm layer op through the
    description's conversion. A model family that fits the description passes this
    to :class:`FusedLayer` and needs no slot of its own."""
    return generic_layer_op(ops.ln_decoder_layer, ops.rms_decoder_layer, ops.decoder_layer)


def decoder_stack_op(ops: OpsTable) -> Callable[..., Any] | None:
    """The stack counterpart of :func:`decoder_layer_op`, for :class:`FusedStack`."""
    return generic_stack_op(ops.ln_decoder_stack, ops.rms_decoder_stack, ops.decoder_stack)
