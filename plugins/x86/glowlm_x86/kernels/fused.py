"""The x86 fused decoder-layer ops (see :mod:`glowlm.ops.fused` for the contract).

``ln_decoder_layer`` runs a pre-LayerNorm layer (OPT, GPT-2) and
``rms_decoder_layer`` an RMSNorm layer (the Llama family) as one compiled call:
the same GEMV/GEMM choice as :func:`glowlm_x86.kernels.linear.dense_linear`, the same
``write_kv`` and ``paged_attention`` calls as :class:`X86AttentionBackend` (and the
same norm, rotary and activation kernels as the x86 ops table), in the module
path's order, so results are identical to running the modules. They decline
(return ``None``) whatever those kernels would not run themselves: cache shapes
the attention kernel does not cover, weight dtypes outside fp32/bf16/fp16, and
(``ln_decoder_layer``, whose layers have none) grouped KV heads.

``ln_decoder_stack`` / ``rms_decoder_stack`` run every layer of a model in one call
(the per-layer ops in a C++ loop); the weights are flattened into one list once per
model and kept. They decline as the per-layer ops do, and also when the layers
differ in what the call passes once (norm epsilon, activation, rotary table).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from glowlm.plugin_api import (
    AttentionLayerSpec,
    AttentionMetadata,
    LnDecoderLayerFn,
    LnDecoderStackFn,
    LnDecoderWeights,
    RmsDecoderLayerFn,
    RmsDecoderStackFn,
    RmsDecoderWeights,
)

from glowlm_x86.kernels.attention import X86AttentionBackend
from glowlm_x86.kernels.linear import KERNEL_DTYPES, GemmPolicy

#: ``info``'s bits for an int8 x int8 projection (fused_layer.cpp's kW8A8).
W8A8 = -8
#: ``bits | ACT_INT8``: a weight-only projection with int8 activations (``wna8_linear``;
#: ``proj::kActInt8``).
ACT_INT8 = 16


def _kernel_dtypes(*tensors: torch.Tensor) -> bool:
    return all(t.dtype in KERNEL_DTYPES for t in tensors)


def tp_state(group: Any) -> torch.Tensor | None:
    """What the stacks' ``tp`` argument takes for a TP group: its shared-memory state
    (``ShmGroup.native_state()``), or None for a group without one (ranks on other
    hosts, gloo), whose layers the stacks decline."""
    native = getattr(group, "native_state", None)
    return None if native is None else native()


def make_ln_decoder_layer(policy: GemmPolicy, attention: X86AttentionBackend
                          ) -> LnDecoderLayerFn:
    def ln_decoder_layer(x: torch.Tensor, w: LnDecoderWeights, kv_cache: torch.Tensor,
                         metadata: AttentionMetadata, spec: AttentionLayerSpec
                         ) -> torch.Tensor | None:
        if (x.dim() != 2 or spec.num_kv_heads != spec.num_heads
                or w.tp_group is not None  # tensor-parallel shards: the stack runs them
                or not attention.supports(spec.head_size, metadata.block_size, kv_cache.dtype)
                or not _kernel_dtypes(w.qkv_weight, w.fc1_weight)):
            return None
        return torch.ops.glowlm_x86.ln_decoder_layer(
            x, w.ln1_weight, w.ln1_bias, w.qkv_weight, w.qkv_bias, w.out_weight, w.out_bias,
            w.ln2_weight, w.ln2_bias, w.fc1_weight, w.fc1_bias, w.fc2_weight, w.fc2_bias,
            kv_cache, metadata.block_tables, metadata.query_start_loc, metadata.seq_lens,
            metadata.slot_mapping, spec.num_heads, spec.scale, w.eps, w.activation,
            policy.gemv_max_m)

    # Admitted so that the stack over these layers can be; declined one by one above.
    ln_decoder_layer.accepts_tensor_parallel = True  # type: ignore[attr-defined]
    return ln_decoder_layer


def make_rms_decoder_layer(policy: GemmPolicy, attention: X86AttentionBackend
                           ) -> RmsDecoderLayerFn:
    def rms_decoder_layer(positions: torch.Tensor, x: torch.Tensor,
                          residual: torch.Tensor | None, w: RmsDecoderWeights,
                          kv_cache: torch.Tensor, metadata: AttentionMetadata,
                          spec: AttentionLayerSpec) -> tuple[torch.Tensor, torch.Tensor] | None:
        if (x.dim() != 2 or w.quant is not None  # quantized layers: the stack runs them
                or w.tp_group is not None  # and so do tensor-parallel shards
                or not attention.supports(spec.head_size, metadata.block_size, kv_cache.dtype)
                or not _kernel_dtypes(w.qkv_weight, w.gate_up_weight)):
            return None
        return torch.ops.glowlm_x86.rms_decoder_layer(
            positions, x, residual, w.ln1_weight, w.qkv_weight, w.qkv_bias, w.q_norm_weight,
            w.k_norm_weight, w.cos_sin_cache, w.rotary_dim, w.is_neox, w.o_weight, w.o_bias,
            w.ln2_weight, w.gate_up_weight, w.gate_up_bias, w.down_weight, w.down_bias,
            kv_cache, metadata.block_tables, metadata.query_start_loc, metadata.seq_lens,
            metadata.slot_mapping, spec.num_heads, spec.num_kv_heads, spec.head_size,
            spec.scale, w.eps, policy.gemv_max_m)

    rms_decoder_layer.accepts_quantized = True  # type: ignore[attr-defined]
    # Admitted so that the stack over these layers can be; declined one by one above.
    rms_decoder_layer.accepts_tensor_parallel = True  # type: ignore[attr-defined]
    return rms_decoder_layer


class _Flat:
    """A model's weights as the stack op's flat lists, made on first use and kept.

    Keyed by the identity of the layers' weight list, which the model keeps for its
    lifetime (:class:`glowlm.layers.fused.FusedStack`: one list of every layer, one of
    all but the last); ``None`` when the stack declines. Holds the two lists of the
    last model used: a process serves one model.
    """

    def __init__(self) -> None:
        self._entries: list[tuple[Sequence[object], list[torch.Tensor | None] | None]] = []

    def get(self, layers: Sequence[object], make) -> list[torch.Tensor | None] | None:  # noqa: ANN001
        for key, flat in self._entries:
            if key is layers:
                return flat
        flat = make(layers)
        self._entries = [*self._entries[-1:], (layers, flat)]
        return flat


def make_ln_decoder_stack(policy: GemmPolicy, attention: X86AttentionBackend
                          ) -> LnDecoderStackFn:
    flat = _Flat()

    def make(layers: Sequence[LnDecoderWeights]) -> list[torch.Tensor | None] | None:
        first = layers[0]
        if any(w.eps != first.eps or w.activation != first.activation
               or not _kernel_dtypes(w.qkv_weight, w.fc1_weight) for w in layers):
            return None
        return [t for w in layers for t in (
            w.ln1_weight, w.ln1_bias, w.qkv_weight, w.qkv_bias, w.out_weight, w.out_bias,
            w.ln2_weight, w.ln2_bias, w.fc1_weight, w.fc1_bias, w.fc2_weight, w.fc2_bias)]

    def ln_decoder_stack(x: torch.Tensor, layers: Sequence[LnDecoderWeights],
                         kv_caches: Sequence[torch.Tensor], metadata: AttentionMetadata,
                         spec: AttentionLayerSpec) -> torch.Tensor | None:
        weights = flat.get(layers, make)
        if (weights is None or x.dim() != 2 or spec.num_kv_heads != spec.num_heads
                or not attention.supports(spec.head_size, metadata.block_size,
                                          kv_caches[0].dtype)):
            return None
        tp = None
        if layers[0].tp_group is not None:  # shards: the kernels all-reduce out and fc2
            tp = tp_state(layers[0].tp_group)
            if tp is None:
                return None
        return torch.ops.glowlm_x86.ln_decoder_stack(
            x, weights, list(kv_caches), metadata.block_tables, metadata.query_start_loc,
            metadata.seq_lens, metadata.slot_mapping, spec.num_heads, spec.scale,
            layers[0].eps, layers[0].activation, policy.gemv_max_m, tp)

    ln_decoder_stack.accepts_tensor_parallel = True  # type: ignore[attr-defined]
    return ln_decoder_stack


def _quant_parts(layers: Sequence[RmsDecoderWeights]
                 ) -> tuple[list[torch.Tensor | None], list[int]] | None:
    """``rms_decoder_stack_q``'s ``quant`` and ``info`` lists (three tensors and three
    ints per projection, see fused_layer.cpp); None if a layer has a projection this op
    cannot run (act-order columns, another plugin's form)."""
    from glowlm_kernels.quant import PackedW8A8, PackedWeightOnly

    quant: list[torch.Tensor | None] = []
    info: list[int] = []
    for w in layers:
        for p in w.quant or (None,) * 4:
            if p is None:
                quant += [None, None, None]
                info += [0, 0, 0]
            elif isinstance(p, PackedWeightOnly) and p.perm is None:
                quant += [p.scales, p.zs, None]
                info += [p.bits | (ACT_INT8 if p.act_block else 0), p.group_size, p.n]
            elif isinstance(p, PackedW8A8):
                static = torch.tensor([p.input_scale], dtype=torch.float32)
                quant += [p.scale, p.wsum, static if p.input_scale > 0 else None]
                info += [W8A8, p.input_zero_point, p.n]
            else:
                return None
    return quant, info


def make_rms_decoder_stack(policy: GemmPolicy, attention: X86AttentionBackend
                           ) -> RmsDecoderStackFn:
    flat = _Flat()
    quant_lists: dict[int, tuple[list[torch.Tensor | None], list[int]] | None] = {}

    def make(layers: Sequence[RmsDecoderWeights]) -> list[torch.Tensor | None] | None:
        first = layers[0]
        if any(w.eps != first.eps or not _same_table(w.cos_sin_cache, first.cos_sin_cache)
               or w.rotary_dim != first.rotary_dim or w.is_neox != first.is_neox
               or not _kernel_dtypes(w.qkv_weight, w.gate_up_weight) for w in layers):
            return None
        if any(w.quant is not None for w in layers):
            parts = _quant_parts(layers)
            if parts is None:
                return None
            while len(quant_lists) >= 2:  # like _Flat: the two lists of the last model
                del quant_lists[next(iter(quant_lists))]
            quant_lists[id(layers)] = parts
        return [t for w in layers for t in (
            w.ln1_weight, _weight(w, 0, w.qkv_weight), w.qkv_bias, w.q_norm_weight,
            w.k_norm_weight, _weight(w, 1, w.o_weight), w.o_bias, w.ln2_weight,
            _weight(w, 2, w.gate_up_weight), w.gate_up_bias, _weight(w, 3, w.down_weight),
            w.down_bias)]

    def rms_decoder_stack(positions: torch.Tensor, x: torch.Tensor,
                          residual: torch.Tensor | None, layers: Sequence[RmsDecoderWeights],
                          kv_caches: Sequence[torch.Tensor], metadata: AttentionMetadata,
                          spec: AttentionLayerSpec) -> tuple[torch.Tensor, torch.Tensor] | None:
        weights = flat.get(layers, make)
        if (weights is None or x.dim() != 2
                or not attention.supports(spec.head_size, metadata.block_size,
                                          kv_caches[0].dtype)):
            return None
        first = layers[0]
        parts = quant_lists.get(id(layers))  # set by make() for quantized layers
        tp = None
        if first.tp_group is not None:  # shards: the kernels all-reduce o and down
            tp = tp_state(first.tp_group)
            if tp is None:
                return None
        if parts is not None or tp is not None:
            quant, info = parts if parts is not None else ([], [])
            return torch.ops.glowlm_x86.rms_decoder_stack_q(
                positions, x, residual, weights, quant, info, list(kv_caches),
                first.cos_sin_cache, first.rotary_dim, first.is_neox, metadata.block_tables,
                metadata.query_start_loc, metadata.seq_lens, metadata.slot_mapping,
                spec.num_heads, spec.num_kv_heads, spec.head_size, spec.scale, first.eps,
                policy.gemv_max_m, tp)
        return torch.ops.glowlm_x86.rms_decoder_stack(
            positions, x, residual, weights, list(kv_caches), first.cos_sin_cache,
            first.rotary_dim, first.is_neox, metadata.block_tables, metadata.query_start_loc,
            metadata.seq_lens, metadata.slot_mapping, spec.num_heads, spec.num_kv_heads,
            spec.head_size, spec.scale, first.eps, policy.gemv_max_m)

    rms_decoder_stack.accepts_quantized = True  # type: ignore[attr-defined]
    rms_decoder_stack.accepts_tensor_parallel = True  # type: ignore[attr-defined]
    return rms_decoder_stack


def _same_table(a: torch.Tensor, b: torch.Tensor) -> bool:
    """One rotary table serves every layer: the same tensor, or (each layer builds its
    own, as Llama-family models do) equal values. Checked once per model, when the
    weight lists are made; before, a value-equal copy made every Llama-family stack
    decline, so those models always ran layer by layer."""
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b))


def _weight(w: RmsDecoderWeights, i: int, dense: torch.Tensor) -> torch.Tensor:
    """Projection ``i``'s weight slot: the prepared packed weight when it is quantized."""
    q = w.quant[i] if w.quant is not None else None
    return dense if q is None else q.weight
