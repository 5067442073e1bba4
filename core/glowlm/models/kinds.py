"""The parts of a decoder layer a family names by kind: norms, MLPs, heads.

Keyed by name so a :class:`~glowlm.models.spec.DecoderSpec` stays data: ``norm="rms"``,
``mlp="gated"``, ``head="lm"``. A mixture-of-experts MLP is another MLP kind
(:mod:`glowlm.models.moe`), a pooling head another head kind; a plugin registers its
own with :func:`register_mlp_kind` / :func:`register_head_kind` / :func:`register_norm_kind`
(one owner per name).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from glowlm.errors import ModelLoadError, PluginError
from glowlm.layers.activation import Activation, GatedActivation
from glowlm.layers.context import ModelParts
from glowlm.layers.embedding import ParallelLMHead
from glowlm.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    RowParallelLinear,
)
from glowlm.layers.norm import GemmaRMSNorm, LayerNorm, RMSNorm
from glowlm.models.spec import DecoderSpec, config_number


def _register(table: dict[str, Any], what: str, name: str, factory: Any) -> None:
    """One owner per kind name, as for architectures (``register_model``): a second
    factory under a taken name would silently change every family that uses it."""
    if name in table and table[name] is not factory:
        raise PluginError(f"{what} kind {name!r} is already registered ({table[name]!r})")
    table[name] = factory


# --- norms ---------------------------------------------------------------------------

#: ``factory(size, eps, parts, prefix)`` -> a norm module with RMSNorm's call convention
#: (``norm(x)`` or ``norm(x, residual) -> (normed, x + residual)``).
NormFactory = Callable[[int, float, ModelParts, str], nn.Module]

class ResidualLayerNorm(LayerNorm):
    """LayerNorm with a bias (Starcoder2's) in RMSNorm's call convention: with a
    residual, ``(norm(x + residual), x + residual)``, the sum rounded to the model dtype
    as transformers' ``residual + hidden`` is."""

    def __init__(self, size: int, eps: float, parts: ModelParts, prefix: str) -> None:
        super().__init__(size, eps, parts)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return super().forward(x)
        x = x + residual
        return super().forward(x), x


NORM_KINDS: dict[str, NormFactory] = {
    "rms": lambda size, eps, parts, prefix: RMSNorm(size, eps, parts),
    "gemma_rms": GemmaRMSNorm,
    "layer": ResidualLayerNorm,
}


def register_norm_kind(name: str, factory: NormFactory) -> None:
    """Make ``DecoderSpec(norm=name)`` build norms with ``factory``."""
    _register(NORM_KINDS, 'norm', name, factory)


# --- MLPs ----------------------------------------------------------------------------

#: ``factory(config, parts, prefix, spec)`` -> a module ``x -> x`` of the hidden size.
#: It may define ``fused_parts() -> (gate_up_proj, down_proj, activation)`` to run in a
#: fused layer (the fused forms know a gated MLP only); without it the layer keeps its
#: modules. A mixture-of-experts block is a new kind (its router and experts under
#: ``prefix``), with no ``fused_parts`` until a platform op runs it.
MlpFactory = Callable[[Any, ModelParts, str, DecoderSpec], nn.Module]

#: Checkpoint activation names -> the fused descriptions' names.
_FUSED_ACTIVATION = {"gelu_pytorch_tanh": "gelu_tanh"}


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up as one column-parallel projection."""

    def __init__(self, config: Any, parts: ModelParts, prefix: str, spec: DecoderSpec) -> None:
        super().__init__()
        inter, bias = config.intermediate_size, bool(getattr(config, "mlp_bias", False))
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter], bias,
                                                       parts, f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias, parts,
                                           f"{prefix}.down_proj")
        act = next((v for k in spec.activation_keys if (v := getattr(config, k, None))),
                   spec.default_activation)
        if spec.activations is not None and act not in spec.activations:
            raise ModelLoadError(f"{spec.activation_keys[0]} {act!r} is not supported for this "
                                 f"architecture (supported: {', '.join(spec.activations)})")
        self.act = GatedActivation(act, parts)
        #: the activation's name in the fused descriptions
        self.activation = _FUSED_ACTIVATION.get(act, act)

    def fused_parts(self) -> tuple[nn.Module, nn.Module, str]:
        return self.gate_up_proj, self.down_proj, self.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class PlainMLP(nn.Module):
    """``c_proj(act(c_fc(x)))`` (Starcoder2): one up projection, no gate, biases where
    the config's :attr:`~glowlm.models.spec.DecoderSpec.bias_key` says."""

    def __init__(self, config: Any, parts: ModelParts, prefix: str, spec: DecoderSpec) -> None:
        super().__init__()
        inter, bias = config.intermediate_size, bool(getattr(config, spec.bias_key, False))
        self.c_fc = ColumnParallelLinear(config.hidden_size, [inter], bias, parts,
                                         f"{prefix}.c_fc")
        self.c_proj = RowParallelLinear(inter, config.hidden_size, bias, parts,
                                        f"{prefix}.c_proj")
        act = next((v for k in spec.activation_keys if (v := getattr(config, k, None))),
                   spec.default_activation)
        if spec.activations is not None and act not in spec.activations:
            raise ModelLoadError(f"{spec.activation_keys[0]} {act!r} is not supported for this "
                                 f"architecture (supported: {', '.join(spec.activations)})")
        self.act = Activation(act, parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


MLP_KINDS: dict[str, MlpFactory] = {"gated": GatedMLP, "plain": PlainMLP}


def register_mlp_kind(name: str, factory: MlpFactory) -> None:
    """Make ``DecoderSpec(mlp=name)`` build each layer's ``mlp`` with ``factory``."""
    _register(MLP_KINDS, 'mlp', name, factory)


# --- heads ---------------------------------------------------------------------------

#: ``factory(model, config, parts, spec)`` sets the head's modules on ``model`` (their
#: names are checkpoint names: the LM head is ``lm_head``) and returns the function from
#: the final hidden states to the output. A pooling head for an embedding model is a
#: new kind.
HeadFactory = Callable[[nn.Module, Any, ModelParts, DecoderSpec],
                       Callable[[torch.Tensor], torch.Tensor]]


def lm_head(model: nn.Module, config: Any, parts: ModelParts, spec: DecoderSpec
            ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The vocabulary projection (tied to the embeddings when the config says so), then
    the family's logit divisor and soft-cap, in transformers' order."""
    model.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, parts, "lm_head")
    model.tied = bool(getattr(config, "tie_word_embeddings", spec.tie_default))
    if model.tied:
        model.lm_head.tie(model.model.embed_tokens)
    divisor = config_number(spec.logits_divisor, config)
    cap = spec.logit_softcap(config) if spec.logit_softcap is not None else None
    cap = float(cap) if cap else None
    head = model.lm_head

    def logits(hidden: torch.Tensor) -> torch.Tensor:
        out = head.compute_logits(hidden)
        if divisor is not None:
            out = out / divisor
        if cap is not None:
            out = torch.tanh(out / cap) * cap
        return out

    return logits


HEAD_KINDS: dict[str, HeadFactory] = {"lm": lm_head}


def register_head_kind(name: str, factory: HeadFactory) -> None:
    """Make ``DecoderSpec(head=name)`` build the model's head with ``factory``."""
    _register(HEAD_KINDS, 'head', name, factory)
