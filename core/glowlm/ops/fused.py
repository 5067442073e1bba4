"""Optional fused layer ops: a whole decoder layer in one platform call.

At decode a layer's small steps (norms, splits, residual adds, activations) are
cheap as kernels but expensive from Python: each GEMV streams the layer's weights
through the caches, so the interpreter code between two GEMVs runs cold. A platform
may therefore offer a fused op for a common layer shape. Core's reference table has
none (``None``); a layer uses a fused op only when the platform provides one, the
op accepts the call (it returns ``None`` for shapes or dtypes it does not cover),
and the layer is in the configuration the op implements. Otherwise the layer runs
its modules, which define the result: a fused op must match them (the x86 one runs
the same kernels in the same order, so it matches bit for bit).

A platform may also offer a *stack* op: every layer of the model in one call, so
the per-layer call itself (a Python frame and a few dozen arguments to parse, each
costing tens of microseconds when cold) is paid once per step rather than once
per layer. A model uses it only when every one of its layers has the fused op; it
may decline with ``None`` as well, and then the layers run one by one. In a prefill
the model passes all but its last layer (which it then runs on the sampled rows
only, :meth:`glowlm.models.base.CausalLM.forward`), so a stack op takes whatever
consecutive run of layers it is given; the model keeps both lists for its lifetime,
and a platform may key per-list caches on their identity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from glowlm.attention.backend import AttentionLayerSpec, AttentionMetadata


@dataclass(frozen=True)
class LnDecoderWeights:
    """A pre-LayerNorm decoder layer: biased multi-head attention, a two-matrix MLP.

    That is OPT with ``do_layer_norm_before`` and GPT-2:
    ``x1 = x + out(attn(qkv(ln1(x))))``, ``y = x1 + fc2(act(fc1(ln2(x1))))``.
    ``qkv_weight`` is ``[3 * hidden, hidden]`` (q, k, v stacked); ``activation`` is
    ``relu``, ``gelu`` or ``gelu_tanh``. The tensors are the layer's parameters
    themselves, so weights moved after loading (huge pages) are seen.
    """

    ln1_weight: torch.Tensor
    ln1_bias: torch.Tensor | None
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    out_weight: torch.Tensor
    out_bias: torch.Tensor | None
    ln2_weight: torch.Tensor
    ln2_bias: torch.Tensor | None
    fc1_weight: torch.Tensor
    fc1_bias: torch.Tensor | None
    fc2_weight: torch.Tensor
    fc2_bias: torch.Tensor | None
    eps: float
    activation: str
    #: Tensor-parallel shards: the TP group, as :attr:`RmsDecoderWeights.tp_group` (qkv
    #: and fc1 column-parallel, out and fc2 row-parallel; only ops that declare
    #: ``accepts_tensor_parallel`` receive such layers).
    tp_group: Any = None


#: ``fn(x, weights, kv_cache, metadata, spec) -> output or None`` (None: not covered).
LnDecoderLayerFn = Callable[[torch.Tensor, LnDecoderWeights, torch.Tensor, AttentionMetadata,
                             AttentionLayerSpec], "torch.Tensor | None"]

#: ``fn(x, layers, kv_caches, metadata, spec) -> output or None``: the layers in order
#: (all of the model's, or all but the last), ``kv_caches[i]`` is ``layers[i]``'s cache;
#: ``spec`` is the (common) attention spec.
LnDecoderStackFn = Callable[[torch.Tensor, Sequence[LnDecoderWeights], Sequence[torch.Tensor],
                             AttentionMetadata, AttentionLayerSpec], "torch.Tensor | None"]


@dataclass(frozen=True)
class RmsDecoderWeights:
    """An RMSNorm decoder layer: Llama, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norms).

    ``x, residual = add_rms_norm(x, residual)``; attention with rotary positions on
    ``qkv`` (``[(heads + 2 * kv_heads) * head_size, hidden]``); ``o``; then
    ``x, residual = add_rms_norm(o, residual)`` and ``down(silu(gate) * up)``. The
    layer returns ``(mlp_out, residual)`` as the module path does.
    """

    ln1_weight: torch.Tensor
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm_weight: torch.Tensor | None
    k_norm_weight: torch.Tensor | None
    cos_sin_cache: torch.Tensor
    rotary_dim: int
    is_neox: bool
    o_weight: torch.Tensor
    o_bias: torch.Tensor | None
    ln2_weight: torch.Tensor
    gate_up_weight: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down_weight: torch.Tensor
    down_bias: torch.Tensor | None
    eps: float
    #: Quantized layers: what each projection's linear method prepared
    #: (``layer.quant_weight``) for qkv, o, gate_up and down, None where a projection is
    #: dense; that projection's ``*_weight`` field is then an empty placeholder. Only an
    #: op that declares ``accepts_quantized = True`` receives such layers (see
    #: :class:`glowlm.layers.fused.FusedLayer`), and it declines a prepared form its
    #: kernels did not make.
    quant: tuple[Any, Any, Any, Any] | None = None
    #: Tensor-parallel shards: the TP group (:class:`glowlm.distributed.shm.ShmGroup`)
    #: whose all-reduce sums the o and down projections' partial outputs (their biases,
    #: whole on every rank, are added once after the sum); None when unsharded. The
    #: weights and ``spec`` are then this rank's shard. Only ops that declare
    #: ``accepts_tensor_parallel = True`` receive such layers; they may reduce in
    #: compiled code through ``tp_group.native_state()`` (same segment, same protocol,
    #: same counter as the group's Python collectives), and decline a group without it.
    tp_group: Any = None


#: ``fn(positions, x, residual, weights, kv_cache, metadata, spec)`` ->
#: ``(out, residual)`` or None (not covered).
RmsDecoderLayerFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None",
                              RmsDecoderWeights, torch.Tensor, AttentionMetadata,
                              AttentionLayerSpec], "tuple[torch.Tensor, torch.Tensor] | None"]

#: ``fn(positions, x, residual, layers, kv_caches, metadata, spec)`` -> the last layer's
#: ``(out, residual)`` or None; arguments as in :data:`LnDecoderStackFn`.
RmsDecoderStackFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None",
                              Sequence[RmsDecoderWeights], Sequence[torch.Tensor],
                              AttentionMetadata, AttentionLayerSpec],
                             "tuple[torch.Tensor, torch.Tensor] | None"]


@dataclass(frozen=True)
class Rotary:
    """Rotary positions of a layer: the float32 ``[max_position, rotary_dim]`` table
    (cos then sin halves), how many features rotate, and the rotation style."""

    cos_sin_cache: torch.Tensor
    rotary_dim: int
    is_neox: bool


@dataclass(frozen=True)
class DecoderLayerWeights:
    """One pre-norm decoder layer described as data, whatever family it comes from.

    ``h = x + o(attn(qkv(norm1(x))))``, ``y = h + down(mlp(norm2(h)))``, where:

    - ``norm`` is ``"layer"`` (LayerNorm, optional biases) or ``"rms"`` (RMSNorm, no
      biases), with one ``eps`` for both norms;
    - attention takes ``qkv_weight`` ``[(heads + 2 * kv_heads) * head_size, hidden]``
      (q, k, v stacked) with an optional bias, optional per-head ``q_norm_weight`` /
      ``k_norm_weight`` (RMSNorm over each head, before rotary: Qwen3), and ``rotary``
      (``None`` for learned absolute positions, added before the layers);
    - ``mlp`` is ``"gated"`` (``up_weight`` holds gate and up stacked,
      ``[2 * inter, hidden]``, and the layer computes ``act(gate) * up``) or ``"plain"``
      (``act(up(x))``); ``activation`` is ``silu``, ``relu``, ``gelu`` or ``gelu_tanh``.

    Gemma 3's layers fit it with four more fields: ``post_norm1_weight`` and
    ``post_norm2_weight`` (its "sandwich" norms: RMSNorm of the attention and of the MLP
    branch before each joins the residual, so ``h = x + post1(o(...))`` and
    ``y = h + post2(down(...))``), ``sliding_window`` (its local layers attend within a
    window, its global ones do not, so the window is the layer's, not the stack's one
    spec) and ``quant``. Norm weights are as the model's norm modules hold them (Gemma:
    ``1 + w`` in float32, which the platform's ``rms_norm`` takes as is).

    A model whose layers fit this description builds one per layer (from its own
    parameters, so weights moved after loading are seen) and gets whatever fused op
    the platform has for it through :class:`glowlm.layers.fused.FusedStack` and
    :func:`generic_stack_op`, with no new core slot. The calling convention is the
    RMSNorm layer's (``(positions, x, residual, ...) -> (out, residual)``; the layer's
    output is ``out + residual``, ``residual=None`` meaning zero), which also covers a
    LayerNorm layer (it returns ``residual=None``).
    """

    norm: str  # "layer" | "rms"
    norm1_weight: torch.Tensor
    norm1_bias: torch.Tensor | None
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_weight: torch.Tensor
    o_bias: torch.Tensor | None
    norm2_weight: torch.Tensor
    norm2_bias: torch.Tensor | None
    mlp: str  # "gated" | "plain"
    activation: str
    up_weight: torch.Tensor
    up_bias: torch.Tensor | None
    down_weight: torch.Tensor
    down_bias: torch.Tensor | None
    eps: float
    rotary: Rotary | None = None
    q_norm_weight: torch.Tensor | None = None
    k_norm_weight: torch.Tensor | None = None
    post_norm1_weight: torch.Tensor | None = None
    post_norm2_weight: torch.Tensor | None = None
    #: This layer's attention window (``AttentionLayerSpec.sliding_window``); a stack op
    #: must honour it (run it, or decline a step in which it hides keys), since the spec
    #: it is given is common to the layers and has none (``FusedStack(per_layer_window=True)``).
    sliding_window: int | None = None
    #: Quantized projections (qkv, o, up, down) as in :attr:`RmsDecoderWeights.quant`:
    #: only ops that declare ``accepts_quantized`` receive such layers.
    quant: tuple[Any, Any, Any, Any] | None = None
    #: Tensor-parallel shards: the TP group, as :attr:`RmsDecoderWeights.tp_group` (only
    #: ops that declare ``accepts_tensor_parallel`` receive such layers).
    tp_group: Any = None

    def _plain(self) -> bool:
        """No part that the OPT/GPT-2 and Llama-family forms lack."""
        return (self.post_norm1_weight is None and self.post_norm2_weight is None
                and self.sliding_window is None)

    def as_ln(self) -> LnDecoderWeights | None:
        """The OPT/GPT-2 form (``ln_decoder_layer``/``_stack``), or None if it does not fit."""
        if (self.norm != "layer" or self.mlp != "plain" or self.rotary is not None
                or not self._plain() or self.quant is not None
                or self.q_norm_weight is not None or self.k_norm_weight is not None
                or self.activation not in ("relu", "gelu", "gelu_tanh")):
            return None
        return LnDecoderWeights(
            ln1_weight=self.norm1_weight, ln1_bias=self.norm1_bias,
            qkv_weight=self.qkv_weight, qkv_bias=self.qkv_bias,
            out_weight=self.o_weight, out_bias=self.o_bias,
            ln2_weight=self.norm2_weight, ln2_bias=self.norm2_bias,
            fc1_weight=self.up_weight, fc1_bias=self.up_bias,
            fc2_weight=self.down_weight, fc2_bias=self.down_bias,
            eps=self.eps, activation=self.activation, tp_group=self.tp_group)

    def as_rms(self) -> RmsDecoderWeights | None:
        """The Llama-family form (``rms_decoder_layer``/``_stack``), or None if it does not fit."""
        if (self.norm != "rms" or self.mlp != "gated" or self.activation != "silu"
                or self.rotary is None or not self._plain() or self.norm1_bias is not None
                or self.norm2_bias is not None):
            return None
        return RmsDecoderWeights(
            ln1_weight=self.norm1_weight, qkv_weight=self.qkv_weight, qkv_bias=self.qkv_bias,
            q_norm_weight=self.q_norm_weight, k_norm_weight=self.k_norm_weight,
            cos_sin_cache=self.rotary.cos_sin_cache, rotary_dim=self.rotary.rotary_dim,
            is_neox=self.rotary.is_neox, o_weight=self.o_weight, o_bias=self.o_bias,
            ln2_weight=self.norm2_weight, gate_up_weight=self.up_weight,
            gate_up_bias=self.up_bias, down_weight=self.down_weight,
            down_bias=self.down_bias, eps=self.eps, quant=self.quant, tp_group=self.tp_group)


#: ``fn(positions, x, residual, weights, kv_cache, metadata, spec)`` -> ``(out, residual)``
#: or None, for one :class:`DecoderLayerWeights` layer.
DecoderLayerFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None",
                           DecoderLayerWeights, torch.Tensor, AttentionMetadata,
                           AttentionLayerSpec], "tuple[torch.Tensor, torch.Tensor | None] | None"]

#: ``fn(positions, x, residual, layers, kv_caches, metadata, spec)`` -> the last layer's
#: ``(out, residual)`` or None, over consecutive :class:`DecoderLayerWeights` layers.
DecoderStackFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None",
                           Sequence[DecoderLayerWeights], Sequence[torch.Tensor],
                           AttentionMetadata, AttentionLayerSpec],
                          "tuple[torch.Tensor, torch.Tensor | None] | None"]


def generic_stack_op(ln_stack: LnDecoderStackFn | None, rms_stack: RmsDecoderStackFn | None,
                     generic: DecoderStackFn | None = None) -> DecoderStackFn | None:
    """The platform's stack op for :class:`DecoderLayerWeights` layers.

    A platform's own ``decoder_stack`` (``generic``) is tried first; layers it declines
    (or all, without one) are converted once per layer list into the form the
    platform's ``ln_decoder_stack`` or ``rms_decoder_stack`` takes (so kernels written
    for those forms serve every family that fits them, and a platform's own op need
    only cover the layers they do not: x86's runs Gemma 3's). The converted list keeps
    its identity for as long as the given list does, as the stack ops' weight caches
    expect. None when the platform has none of the three; the returned op declines
    (None) layers that none of them takes. Like the descriptions of families that
    predate :attr:`DecoderLayerWeights.quant`, it does not accept quantized layers
    (a model whose description fills ``quant`` passes the platform's own op, which
    says whether it does).
    """
    if ln_stack is None and rms_stack is None:
        return generic
    converted: dict[int, tuple[Sequence[DecoderLayerWeights], list, str]] = {}

    def convert(layers: Sequence[DecoderLayerWeights]) -> tuple[list, str] | None:
        hit = converted.get(id(layers))
        if hit is not None and hit[0] is layers:
            return hit[1], hit[2]
        for kind, fn, to in (("rms", rms_stack, DecoderLayerWeights.as_rms),
                             ("ln", ln_stack, DecoderLayerWeights.as_ln)):
            if fn is None:
                continue
            out = [to(w) for w in layers]
            if all(o is not None for o in out):
                converted[id(layers)] = (layers, out, kind)
                return out, kind
        return None

    def decoder_stack(positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                      layers: Sequence[DecoderLayerWeights], kv_caches: Sequence[torch.Tensor],
                      metadata: AttentionMetadata, spec: AttentionLayerSpec
                      ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        if generic is not None:
            out = generic(positions, x, residual, layers, kv_caches, metadata, spec)
            if out is not None:
                return out
        found = convert(layers)
        if found is None:
            return None
        weights, kind = found
        if kind == "rms":
            assert rms_stack is not None
            return rms_stack(positions, x, residual, weights, kv_caches, metadata, spec)
        assert ln_stack is not None
        h = x if residual is None else x + residual
        out = ln_stack(h, weights, kv_caches, metadata, spec)
        return None if out is None else (out, None)

    return decoder_stack


def generic_layer_op(ln_layer: LnDecoderLayerFn | None, rms_layer: RmsDecoderLayerFn | None,
                     generic: DecoderLayerFn | None = None) -> DecoderLayerFn | None:
    """The per-layer counterpart of :func:`generic_stack_op` (one layer per call)."""
    if ln_layer is None and rms_layer is None:
        return generic

    def decoder_layer(positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                      w: DecoderLayerWeights, kv_cache: torch.Tensor,
                      metadata: AttentionMetadata, spec: AttentionLayerSpec
                      ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        if generic is not None:
            out = generic(positions, x, residual, w, kv_cache, metadata, spec)
            if out is not None:
                return out
        rms = w.as_rms() if rms_layer is not None else None
        if rms is not None:
            assert rms_layer is not None
            return rms_layer(positions, x, residual, rms, kv_cache, metadata, spec)
        ln = w.as_ln() if ln_layer is not None else None
        if ln is None:
            return None
        assert ln_layer is not None
        out = ln_layer(x if residual is None else x + residual, ln, kv_cache, metadata, spec)
        return None if out is None else (out, None)

    return decoder_layer
