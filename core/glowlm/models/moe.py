"""Mixture-of-experts families: Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE.

Their attention and norms are the shared decoder's (Qwen3's q/k norm, Qwen2's qkv bias,
OLMoE's q/k norm over the whole projection); what they add is the MLP kind ``"moe"``
(:func:`moe_mlp`): a router and stacked experts (:class:`glowlm.layers.moe.MoEMLP`) on
the layers the config makes sparse, a dense gated MLP on the others. How each family
routes is transformers' (softmax in float32, top-k, renormalized by ``norm_topk_prob``;
Mixtral always renormalizes, and has no such field).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from glowlm.errors import ModelLoadError
from glowlm.layers.context import ModelParts
from glowlm.layers.moe import MoEMLP
from glowlm.models.decoder import DecoderLM, DecoderSpec, GatedMLP, register_mlp_kind


def num_experts(config: Any) -> int:
    """Routed experts per layer (``num_experts``; Mixtral's ``num_local_experts``)."""
    return int(getattr(config, "num_experts", None) or getattr(config, "num_local_experts", 0))


def is_sparse(config: Any, index: int) -> bool:
    """Whether layer ``index`` has experts: transformers' rule for Qwen-MoE
    (``mlp_only_layers`` dense, else every ``decoder_sparse_step``-th layer), and every
    layer for families without those fields."""
    if num_experts(config) <= 0 or index in (getattr(config, "mlp_only_layers", None) or ()):
        return False
    step = int(getattr(config, "decoder_sparse_step", 1) or 1)
    return (index + 1) % step == 0


def moe_mlp(config: Any, parts: ModelParts, prefix: str, spec: DecoderSpec) -> nn.Module:
    """The ``"moe"`` MLP kind: ``prefix`` is ``model.layers.<i>.mlp``."""
    index = int(prefix.rsplit(".", 2)[-2])
    if not is_sparse(config, index):
        return GatedMLP(config, parts, prefix, spec)
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ModelLoadError(f"hidden_act {act!r} is not supported for experts (supported: silu)")
    inter = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    return MoEMLP(config.hidden_size, num_experts(config), int(config.num_experts_per_tok),
                  int(inter), bool(getattr(config, "norm_topk_prob", True)), parts, prefix,
                  int(getattr(config, "shared_expert_intermediate_size", 0) or 0))


register_mlp_kind("moe", moe_mlp)


def _no_clip(config: Any) -> None:
    if getattr(config, "clip_qkv", None) is not None:
        raise ModelLoadError(f"clip_qkv={config.clip_qkv} is not supported (OLMoE releases "
                             "leave it null)")


class Qwen3MoeForCausalLM(DecoderLM):
    family = DecoderSpec(qk_norm="head", mlp="moe")


class Qwen2MoeForCausalLM(DecoderLM):
    """Qwen2's attention (q/k/v biased, o not) and a shared expert beside the routed ones."""

    family = DecoderSpec(qkv_bias=True, o_bias=False, mlp="moe")


class MixtralForCausalLM(DecoderLM):
    """Mistral's layers with ``block_sparse_moe`` experts ``w1``/``w3``/``w2``."""

    family = DecoderSpec(mlp="moe", renames=((".block_sparse_moe.", ".mlp."),))


class OlmoeForCausalLM(DecoderLM):
    family = DecoderSpec(qk_norm="projection", mlp="moe", check=_no_clip)
