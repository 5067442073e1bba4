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
