"""What a decoder family declares: :class:`DecoderSpec`, where its norms sit, its layers' types.

A family (Llama, Qwen3, Gemma 3, Granite, ...) is a frozen :class:`DecoderSpec` whose
defaults are Llama's; fields that depend on the checkpoint are functions of the
transformers config, called once when the model is built. The decoder that runs a
declaration is :mod:`glowlm.models.decoder`; the parts named by kind (norms, MLPs,
heads) are :mod:`glowlm.models.kinds`'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from glowlm.errors import ModelLoadError
from glowlm.layers.rotary import rope_settings

SLIDING, FULL = "sliding_attention", "full_attention"

#: q, k, v into ``qkv_proj`` and gate, up into ``gate_up_proj``: every family here.
LLAMA_STACKED: tuple[tuple[str, str, str | int], ...] = (
    ("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1))

#: ``(theta, rope_scaling)`` of a layer, or None for a layer without rotary positions.
RopeSettings = tuple[float, dict[str, Any] | None] | None
#: ``rope(config, layer_index, layer_type)``.
RopeFn = Callable[[Any, int, str], RopeSettings]
#: A number read from the config (None or 1.0: nothing to apply).
ConfigNumber = Callable[[Any], float | None]


def single_rope(config: Any, index: int, layer_type: str) -> RopeSettings:
    """Every layer: one ``rope_theta`` and the config's ``rope_scaling`` (Llama 3.1's too)."""
    return rope_settings(config)


def all_full(config: Any) -> list[str]:
    """Every layer attends to the whole context."""
    return [FULL] * config.num_hidden_layers


def sliding_if_set(config: Any) -> list[str]:
    """Every layer within ``config.sliding_window`` when it is set, else every layer full
    (Phi-3 and Starcoder2, whose attention passes the window to every layer)."""
    window = getattr(config, "sliding_window", None)
    return [SLIDING if window else FULL] * config.num_hidden_layers


def rms_norm_eps(config: Any) -> float:
    return float(config.rms_norm_eps)


def layer_types(config: Any) -> list[str]:
    """``sliding_attention`` / ``full_attention`` per layer: ``config.layer_types``, or
    the older ``sliding_window_pattern`` (every n-th layer global, the rest local)."""
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if not types:
        pattern = int(getattr(config, "sliding_window_pattern", None)
                      or getattr(config, "_sliding_window_pattern", None) or 6)
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
    types = list(types)
    if len(types) != n or not set(types) <= {SLIDING, FULL}:
        raise ModelLoadError(f"config layer_types must list {n} of {SLIDING!r} / {FULL!r}, "
                             f"got {types!r}")
    return types


def windowed_layers(config: Any) -> list[str]:
    """Qwen2's rule: ``config.layer_types`` where the config lists them (transformers
    derives them from ``use_sliding_window`` and ``max_window_layers``), else the same
    rule from those fields; without ``use_sliding_window`` every layer is full."""
    if getattr(config, "layer_types", None):
        return layer_types(config)
    n = config.num_hidden_layers
    if not (getattr(config, "use_sliding_window", False)
            and getattr(config, "sliding_window", None)):
        return [FULL] * n
    first = int(getattr(config, "max_window_layers", n) or 0)
    return [SLIDING if i >= first else FULL for i in range(n)]


def rope_for(config: Any, layer_type: str) -> tuple[float, dict[str, Any] | None]:
    """``(theta, scaling)`` of one layer type, from transformers 5's per-type
    ``rope_parameters`` or the older ``rope_local_base_freq`` / ``rope_theta`` +
    ``rope_scaling`` (local layers are never scaled): Gemma 3's local/global rotary."""
    rope = getattr(config, "rope_parameters", None) or {}
    params = rope.get(layer_type)
    flat = rope if "rope_theta" in rope else {}  # one set for every layer: the global one
    if isinstance(params, dict) and params:
        theta, scaling = float(params["rope_theta"]), dict(params)
    elif layer_type == SLIDING:
        theta, scaling = float(getattr(config, "rope_local_base_freq", None) or 10000.0), None
    else:
        theta = float(flat.get("rope_theta") or getattr(config, "rope_theta", None)
                      or 1_000_000.0)
        scaling = getattr(config, "rope_scaling", None) or (dict(flat) if flat else None)
    if scaling is not None and scaling.get("rope_type", scaling.get("type", "default")) \
            == "default":
        scaling = None
    return theta, scaling


def local_global_rope(config: Any, index: int, layer_type: str) -> RopeSettings:
    """Local (windowed) and global layers each with their own table (:func:`rope_for`)."""
    return rope_for(config, layer_type)


@dataclass(frozen=True)
class NormPlacement:
    """Which norms a layer has, by their checkpoint names (None: that norm is absent).

    ``pre_attn`` / ``pre_mlp`` normalise a branch's input (and add the residual);
    ``post_attn`` / ``post_mlp`` normalise a branch's output before it joins the residual.
    """

    pre_attn: str | None = "input_layernorm"
    post_attn: str | None = None
    pre_mlp: str | None = "post_attention_layernorm"
    post_mlp: str | None = None

    def names(self) -> list[tuple[str, str]]:
        """``(role, checkpoint name)`` of the norms present."""
        return [(role, name) for role in ("pre_attn", "post_attn", "pre_mlp", "post_mlp")
                if (name := getattr(self, role)) is not None]


#: Llama's: a norm before each branch (Llama's pre-MLP norm is "post_attention_layernorm").
PRE_NORM = NormPlacement()
#: Gemma's "sandwich": a norm before and after each branch.
SANDWICH = NormPlacement("input_layernorm", "post_attention_layernorm",
                         "pre_feedforward_layernorm", "post_feedforward_layernorm")


@dataclass(frozen=True)
class DecoderSpec:
    """How one decoder family differs from Llama; the defaults are Llama's.

    Config-dependent fields are functions of the transformers config, called once when
    the model is built; a number they return that is None or 1.0 means "not applied",
    so one declaration serves checkpoints that leave a multiplier at its neutral value
    (and those keep the fused paths).
    """

    #: The norm's formula, a :data:`NORM_KINDS` key (``"rms"``; ``"gemma_rms"``: ``1 + w``;
    #: ``"layer"``: LayerNorm with a bias).
    norm: str = "rms"
    #: Where the norms sit and what the checkpoint calls them.
    norms: NormPlacement = PRE_NORM
    #: The norms' epsilon from the config (``rms_norm_eps``; Starcoder2: ``norm_epsilon``).
    norm_eps: Callable[[Any], float] = rms_norm_eps
    #: q/k/v and o biases; None: the config field :attr:`bias_key` names.
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    #: The config field that sets the projections' biases (Starcoder2: ``use_bias``).
    bias_key: str = "attention_bias"
    #: Norms of q and k before rotary, in :attr:`norm`'s kind: ``"head"`` over each head
    #: (Qwen3, Gemma 3), ``"projection"`` over the whole q and k projections (OLMo 2).
    qk_norm: str | None = None
    #: The attention scale ``f(config, head_size)``; None: ``head_size ** -0.5``.
    query_scale: Callable[[Any, int], float] | None = None
    #: Scaled attention scores soft-capped, ``cap * tanh(s / cap)`` (Gemma 2's
    #: ``attn_logit_softcapping``); None or 0: not capped.
    attn_softcap: ConfigNumber | None = None
    #: Per-layer ``sliding_attention`` / ``full_attention``; a sliding layer attends
    #: within ``config.sliding_window``.
    layer_types: Callable[[Any], list[str]] = all_full
    #: Per-layer rotary settings (None: that layer has no rotary positions). Layers with
    #: equal settings share one cos/sin table.
    rope: RopeFn = single_rope
    #: The feed-forward block, a :data:`MLP_KINDS` key (``"gated"``: gate/up/down;
    #: ``"plain"``: ``c_proj(act(c_fc(x)))``, Starcoder2's).
    mlp: str = "gated"
    #: Config fields naming the gated MLP's activation, first set wins, and the default.
    activation_keys: tuple[str, ...] = ("hidden_act",)
    default_activation: str = "silu"
    #: Activations the family accepts (None: any the platform has a gated op for).
    activations: tuple[str, ...] | None = ("silu",)
    #: Embeddings times this; ``embed_scale_in_dtype``: the factor rounded to the model
    #: dtype first (Gemma: sqrt(hidden) as transformers computes it, 25.30 -> 25.25 in bf16).
    embed_scale: ConfigNumber | None = None
    embed_scale_in_dtype: bool = False
    #: Each branch's output times this before it joins the residual (Granite).
    residual_scale: ConfigNumber | None = None
    #: What turns the final hidden state into the output, a :data:`HEAD_KINDS` key.
    head: str = "lm"
    #: Logits divided by this (Granite's ``logits_scaling``).
    logits_divisor: ConfigNumber | None = None
    #: ``cap * tanh(logits / cap)`` (Gemma's ``final_logit_softcapping``).
    logit_softcap: ConfigNumber | None = None
    #: ``tie_word_embeddings`` when the config does not say.
    tie_default: bool = False
    #: Checkpoint tensors fused into one parameter: (parameter, checkpoint part, shard).
    stacked: tuple[tuple[str, str, str | int], ...] = LLAMA_STACKED
    #: Checkpoint tensors to skip: any whose name contains one of these.
    skip: tuple[str, ...] = ("rotary_emb",)
    #: Checkpoint name substrings replaced before loading (``(old, new)``, in order).
    renames: tuple[tuple[str, str], ...] = ()
    #: The fused layer form (a :data:`FUSED_FORMS` key) or None for modules only.
    fused: str | None = "rms"
    #: Raises :class:`~glowlm.errors.ModelLoadError` for configs the family cannot serve
    #: (or warns about fields it ignores); called before anything is built.
    check: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        # The kind names are checked against their registries (glowlm.models.kinds) when
        # a family class is declared (DecoderLM.__init_subclass__): a plugin may register
        # a kind after this module is imported.
        if self.qk_norm not in (None, "head", "projection"):
            raise ValueError(f"DecoderSpec qk_norm={self.qk_norm!r} is not None, 'head' or "
                             "'projection'")
        if self.fused == "rms" and (self.norm != "rms" or self.norms != PRE_NORM
                                    or self.activations != ("silu",)):
            raise ValueError("fused='rms' is Llama's layer (plain RMSNorm before each branch, "
                             "SiLU-gated MLP); use fused='decoder' or None")


def config_number(fn: ConfigNumber | None, config: Any) -> float | None:
    value = fn(config) if fn is not None else None
    return None if value is None or float(value) == 1.0 else float(value)
