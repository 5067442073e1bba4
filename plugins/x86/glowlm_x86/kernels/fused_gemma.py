"""The x86 ``decoder_stack`` / ``decoder_layer`` ops: Gemma 3's layers in one compiled call.

Gemma 3 does not fit the Llama-shaped ``rms_decoder_stack`` (four norms per layer, the
last two on the branches; GeGLU; local and global layers with their own rotary tables
and windows), so it is described as :class:`~glowlm.plugin_api.DecoderLayerWeights` and
runs on ``gemma_decoder_stack`` (csrc/torch/gemma_layer.cpp): the module path's kernels
in the module path's order, so tokens and log-probabilities are identical to running
the modules. Dense fp32/bf16/fp16 and quantized projections (weight-only and W8A8, the
encoding of ``rms_decoder_stack_q``, :func:`glowlm_x86.kernels.fused._quant_parts`).

Local layers attend their window in the paged attention kernel (each layer's
``sliding_window`` goes to the op), so the stack runs every step whatever the context
length, bit for bit the module path's (whose x86 attention backend runs the same
windowed kernel). Tensor-parallel shards run too: the op sums the o and down
projections over the TP group in C++ (``tp``, as ``rms_decoder_stack_q``). Layers of
another shape are declined: :func:`glowlm.plugin_api.decoder_stack_op`
tries this op first and converts what it declines to the platform's LayerNorm/RMSNorm
forms, so offering it takes nothing from the families those serve.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from glowlm.plugin_api import (
    AttentionLayerSpec,
    AttentionMetadata,
    DecoderLayerFn,
    DecoderLayerWeights,
    DecoderStackFn,
)

from glowlm_x86.kernels.attention import X86AttentionBackend
from glowlm_x86.kernels.fused import _quant_parts, tp_state
from glowlm_x86.kernels.linear import KERNEL_DTYPES, GemmPolicy


def is_gemma(w: DecoderLayerWeights) -> bool:
    """Whether ``w`` is the layer ``gemma_decoder_stack`` runs: RMSNorm with the two
    branch norms, q/k norms, rotary, a gated tanh-GELU MLP, no norm biases."""
    return (w.norm == "rms" and w.mlp == "gated" and w.activation == "gelu_tanh"
            and w.rotary is not None and w.q_norm_weight is not None
            and w.k_norm_weight is not None and w.post_norm1_weight is not None
            and w.post_norm2_weight is not None and w.norm1_bias is None
            and w.norm2_bias is None)


def _flatten(layers: Sequence[DecoderLayerWeights]) -> list[torch.Tensor | None] | None:
    """The op's weight list, or None when the layers are not all Gemma's or differ in
    what the call passes once (epsilon, rotary width and style)."""
    first = layers[0]
    if not all(is_gemma(w) for w in layers):
        return None
    assert first.rotary is not None
    if any(w.eps != first.eps or w.rotary is None
           or w.rotary.rotary_dim != first.rotary.rotary_dim
           or w.rotary.is_neox != first.rotary.is_neox
           or not all(t.dtype in KERNEL_DTYPES for t in (w.qkv_weight, w.up_weight))
           for w in layers):
        return None
    out: list[torch.Tensor | None] = []
    for w in layers:
        assert w.rotary is not None
        out += [w.norm1_weight, _weight(w, 0, w.qkv_weight), w.qkv_bias, w.q_norm_weight,
                w.k_norm_weight, _weight(w, 1, w.o_weight), w.o_bias, w.post_norm1_weight,
                w.norm2_weight, _weight(w, 2, w.up_weight), w.up_bias,
                _weight(w, 3, w.down_weight), w.down_bias, w.post_norm2_weight,
                w.rotary.cos_sin_cache]
    return out


def _weight(w: DecoderLayerWeights, i: int, dense: torch.Tensor) -> torch.Tensor:
    """Projection ``i``'s weight slot: the prepared packed weight when it is quantized."""
    q = w.quant[i] if w.quant is not None else None
    return dense if q is None else q.weight


_NO_QUANT: tuple[list[torch.Tensor | None], list[int]] = ([], [])
#: A flattened layer list: the op's weights, quant, info and windows lists; None: declined.
Prepared = tuple[list[torch.Tensor | None], list[torch.Tensor | None], list[int],
                 list[int]] | None


class _Prepared:
    """Layer lists flattened for the op, made on first use and kept, keyed by the
    list's identity (a model keeps its lists for its lifetime: the stack's two, one
    per layer for the per-layer op). Holds the last ``capacity`` lists, so a process
    that loads another model lets the old one's weights go."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: dict[int, tuple[Sequence[DecoderLayerWeights], Prepared]] = {}

    def get(self, layers: Sequence[DecoderLayerWeights]) -> Prepared:
        hit = self._entries.get(id(layers))
        if hit is not None and hit[0] is layers:
            return hit[1]
        made = _prepare(layers)
        while len(self._entries) >= self.capacity:
            del self._entries[next(iter(self._entries))]
        self._entries[id(layers)] = (layers, made)
        return made


def _prepare(layers: Sequence[DecoderLayerWeights]) -> Prepared:
    weights = _flatten(layers)
    if weights is None:
        return None
    windows = [w.sliding_window or 0 for w in layers]
    if not any(w.quant is not None for w in layers):
        return weights, *_NO_QUANT, windows
    parts = _quant_parts(layers)  # type: ignore[arg-type]  # it reads .quant only
    return None if parts is None else (weights, *parts, windows)


def make_decoder_stack(policy: GemmPolicy, attention: X86AttentionBackend, capacity: int = 2
                       ) -> DecoderStackFn:
    prepared = _Prepared(capacity)

    def decoder_stack(positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                      layers: Sequence[DecoderLayerWeights], kv_caches: Sequence[torch.Tensor],
                      metadata: AttentionMetadata, spec: AttentionLayerSpec
                      ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        if not is_gemma(layers[0]):
            return None
        made = prepared.get(layers)
        if (made is None or x.dim() != 2
                or not attention.supports(spec.head_size, metadata.block_size,
                                          kv_caches[0].dtype)):
            return None
        weights, quant, info, windows = made
        first = layers[0]
        assert first.rotary is not None
        tp = None
        if first.tp_group is not None:  # shards: the op all-reduces o and down
            tp = tp_state(first.tp_group)
            if tp is None:
                return None
        return torch.ops.glowlm_x86.gemma_decoder_stack(
            positions, x, residual, weights, quant, info, windows, list(kv_caches),
            first.rotary.rotary_dim, first.rotary.is_neox, metadata.block_tables,
            metadata.query_start_loc, metadata.seq_lens, metadata.slot_mapping,
            spec.num_heads, spec.num_kv_heads, spec.head_size, spec.scale, first.eps,
            policy.gemv_max_m, tp)

    decoder_stack.accepts_quantized = True  # type: ignore[attr-defined]
    decoder_stack.accepts_tensor_parallel = True  # type: ignore[attr-defined]
    return decoder_stack


def make_decoder_layer(policy: GemmPolicy, attention: X86AttentionBackend) -> DecoderLayerFn:
    """One Gemma layer per call: the stack op over that layer alone (its one-element
    list kept per layer); other layers are declined. A Gemma model runs its layers one
    by one with it when the stack declines a step or for a pipeline stage's layers."""
    stack = make_decoder_stack(policy, attention, capacity=256)
    singles: dict[int, tuple[DecoderLayerWeights, list[DecoderLayerWeights]]] = {}

    def decoder_layer(positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                      w: DecoderLayerWeights, kv_cache: torch.Tensor,
                      metadata: AttentionMetadata, spec: AttentionLayerSpec
                      ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        if not is_gemma(w):
            return None
        hit = singles.get(id(w))
        if hit is None or hit[0] is not w:
            if len(singles) >= 256:
                singles.clear()
            hit = singles[id(w)] = (w, [w])
        return stack(positions, x, residual, hit[1], [kv_cache], metadata, spec)

    decoder_layer.accepts_quantized = True  # type: ignore[attr-defined]
    decoder_layer.accepts_tensor_parallel = True  # type: ignore[attr-defined]
    return decoder_layer


def gemma_ops(policy: GemmPolicy, attention: X86AttentionBackend
              ) -> dict[str, Callable[..., Any]]:
    """The ops-table entries (``decoder_stack``, ``decoder_layer``) for the x86 platform."""
    return {"decoder_stack": make_decoder_stack(policy, attention),
            "decoder_layer": make_decoder_layer(policy, attention)}
