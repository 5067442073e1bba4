"""One RMSNorm-family decoder; a model family is a :class:`DecoderSpec` declaring how it differs.

Llama, Mistral, Qwen2/3, Gemma 3, Granite, SmolLM3 and OLMo 2 run the same math: embed,
then per layer ``attention (rotary q/k) -> residual add -> gated MLP -> residual add``
with RMSNorms around the branches, then a final norm and the LM head. What sets one
family apart is a handful of choices: the norm's formula and where norms sit, biases,
q/k norms, the attention scale, which layers attend within a window and with which
rotary table, the MLP, constant multipliers (embeddings, residual branches, logits) and
how checkpoint tensors are named. Writing each family as a copy of the decoder with its
own choices let the copies drift (a fix to one model's pruned prefill or pipeline stage
had to be made once per file); here the choices are data and :class:`DecoderModel` /
:class:`DecoderLM` implement the math once.

A new family is a frozen :class:`DecoderSpec` and a subclass naming it::

    class GraniteForCausalLM(DecoderLM):
        family = DecoderSpec(residual_scale=lambda c: c.residual_multiplier, ...)

Fields that depend on the checkpoint are functions of the transformers config (read
once, when the model is built), so a declaration says *which* config field means what.

Extension points for parts that are more than a switch, keyed by name so a declaration
stays data: :data:`NORM_KINDS` (a norm's formula), :data:`MLP_KINDS` (the feed-forward
block: a mixture-of-experts MLP is another kind, built from the same ``(config, parts,
prefix, spec)``) and :data:`HEAD_KINDS` (what turns the final hidden state into the
model's output: the LM head today, a pooling head for an embedding model later). Register
with :func:`register_mlp_kind` / :func:`register_head_kind` / :func:`register_norm_kind`.

Fused fast paths: a layer describes itself in the form its family's ``fused`` names
(:data:`FUSED_FORMS`): ``"rms"`` is the Llama form (:class:`~glowlm.ops.fused.RmsDecoderWeights`,
the platform's ``rms_decoder_layer`` / ``rms_decoder_stack``), ``"decoder"`` the general
description (:class:`~glowlm.ops.fused.DecoderLayerWeights`, the platform's own
``decoder_layer`` / ``decoder_stack``: Gemma 3's sandwich norms and windows). A layer
whose configuration the form cannot express (a residual multiplier, no rotary, q/k norms
over the whole projection, a window in the Llama form, an MLP kind without a fused
description) runs its modules, which always define the result.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from glowlm.attention.backend import AttentionMetadata
from glowlm.distributed.parallel import PPMissingLayer, own_layers
from glowlm.errors import ModelLoadError
from glowlm.layers.attention import Attention
from glowlm.layers.context import ModelParts
from glowlm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from glowlm.layers.fused import FusedLayer, FusedStack, projection_weights
from glowlm.layers.linear import QKVParallelLinear, RowParallelLinear
from glowlm.layers.rotary import RotaryEmbedding, max_positions, rotary_dim
from glowlm.models.base import CausalLM, prune_rows
from glowlm.models.kinds import (
    HEAD_KINDS,
    MLP_KINDS,
    NORM_KINDS,
    GatedMLP,
    register_head_kind,
    register_mlp_kind,
    register_norm_kind,
)
from glowlm.models.spec import (
    FULL,
    LLAMA_STACKED,
    PRE_NORM,
    SANDWICH,
    SLIDING,
    DecoderSpec,
    NormPlacement,
    RopeSettings,
    all_full,
    config_number,
    layer_types,
    local_global_rope,
    rope_for,
    single_rope,
)
from glowlm.ops.fused import DecoderLayerWeights, RmsDecoderWeights, Rotary
from glowlm.ops.table import OpsTable

#: The decoder's public face: a family module imports its declaration's parts from here.
__all__ = ["FULL", "HEAD_KINDS", "LLAMA_STACKED", "MLP_KINDS", "NORM_KINDS", "PRE_NORM",
           "SANDWICH", "SLIDING", "DecoderLM", "DecoderLayer", "DecoderModel", "DecoderSpec",
           "GatedMLP", "NormPlacement", "all_full", "layer_types", "local_global_rope",
           "register_head_kind", "register_mlp_kind", "register_norm_kind", "rope_for",
           "single_rope"]

# --- fused forms ---------------------------------------------------------------------

@dataclass(frozen=True)
class FusedForm:
    """How a family's layers reach a platform's fused ops.

    ``layer_op`` / ``stack_op`` pick the ops-table entries, ``describe`` builds a layer's
    description from its modules. ``per_layer_window``: the description carries each
    layer's window (:class:`FusedStack`). ``stack_with_residual``: the stack op may start
    from a residual (a later pipeline stage); the Llama form's starts from the embedding.
    """

    layer_op: Callable[[OpsTable], Any]
    stack_op: Callable[[OpsTable], Any]
    describe: Callable[[DecoderLayer], Any]
    per_layer_window: bool
    stack_with_residual: bool


def _rms_weights(layer: DecoderLayer) -> RmsDecoderWeights:
    a = layer.self_attn
    up, down, _ = layer.mlp.fused_parts()
    (qkv_w, o_w, gate_up_w, down_w), quant = projection_weights((a.qkv_proj, a.o_proj, up, down))
    pre_attn, pre_mlp = layer.norm("pre_attn"), layer.norm("pre_mlp")
    return RmsDecoderWeights(
        pre_attn.weight, qkv_w, a.qkv_proj.bias,
        a.q_norm.weight if a.q_norm is not None else None,
        a.k_norm.weight if a.k_norm is not None else None,
        a.rotary.cos_sin_cache, a.rotary.rotary_dim, a.rotary.is_neox, o_w,
        a.o_proj.bias, pre_mlp.weight, gate_up_w, up.bias, down_w, down.bias, pre_attn.eps,
        quant=quant, tp_group=layer.fused.tp_group)


def _decoder_weights(layer: DecoderLayer) -> DecoderLayerWeights:
    a = layer.self_attn
    up, down, activation = layer.mlp.fused_parts()
    (qkv_w, o_w, up_w, down_w), quant = projection_weights((a.qkv_proj, a.o_proj, up, down))
    post_attn, post_mlp = layer.norm("post_attn"), layer.norm("post_mlp")
    return DecoderLayerWeights(
        norm="rms", norm1_weight=layer.norm("pre_attn").weight, norm1_bias=None,
        qkv_weight=qkv_w, qkv_bias=a.qkv_proj.bias, o_weight=o_w, o_bias=a.o_proj.bias,
        norm2_weight=layer.norm("pre_mlp").weight, norm2_bias=None,
        mlp="gated", activation=activation, up_weight=up_w, up_bias=up.bias,
        down_weight=down_w, down_bias=down.bias, eps=layer.norm("pre_attn").eps,
        rotary=Rotary(a.rotary.cos_sin_cache, a.rotary.rotary_dim, a.rotary.is_neox),
        q_norm_weight=a.q_norm.weight if a.q_norm is not None else None,
        k_norm_weight=a.k_norm.weight if a.k_norm is not None else None,
        post_norm1_weight=post_attn.weight if post_attn is not None else None,
        post_norm2_weight=post_mlp.weight if post_mlp is not None else None,
        sliding_window=a.attn.spec.sliding_window,
        quant=quant, tp_group=layer.fused.tp_group)


FUSED_FORMS: dict[str, FusedForm] = {
    "rms": FusedForm(lambda ops: ops.rms_decoder_layer, lambda ops: ops.rms_decoder_stack,
                     _rms_weights, per_layer_window=False, stack_with_residual=False),
    "decoder": FusedForm(lambda ops: ops.decoder_layer, lambda ops: ops.decoder_stack,
                         _decoder_weights, per_layer_window=True, stack_with_residual=True),
}


# --- the decoder ---------------------------------------------------------------------

class DecoderAttention(nn.Module):
    """Fused q/k/v projection, optional per-head q/k norms, rotary, paged attention, o."""

    def __init__(self, config: Any, index: int, parts: ModelParts, prefix: str,
                 spec: DecoderSpec, rotary: RotaryEmbedding | None, window: int | None) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_size = getattr(config, "head_dim", None) or hidden // self.num_heads
        tp = parts.parallel.tp_size
        self.q_size = self.num_heads * self.head_size // tp
        self.kv_size = max(1, self.num_kv_heads // tp) * self.head_size
        # Llama's `attention_bias` covers q, k, v and o; Qwen2 always has q, k, v biases
        # and never an o bias.
        config_bias = bool(getattr(config, spec.bias_key, False))
        qkv_bias = config_bias if spec.qkv_bias is None else spec.qkv_bias
        o_bias = config_bias if spec.o_bias is None else spec.o_bias
        self.qkv_proj = QKVParallelLinear(hidden, self.head_size, self.num_heads,
                                          self.num_kv_heads, qkv_bias, parts, f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(self.num_heads * self.head_size, hidden, o_bias, parts,
                                        f"{prefix}.o_proj")
        self.rotary = rotary  # shared by the layers with the same settings
        self.q_norm = self.k_norm = None
        #: q/k norms over the whole projection rather than each head
        self.qk_norm_projection = spec.qk_norm == "projection"
        if spec.qk_norm is not None:
            norm, eps = NORM_KINDS[spec.norm], spec.norm_eps(config)
            q_size, kv_size = self.head_size, self.head_size
            if self.qk_norm_projection:
                if tp > 1:  # the mean square would need the other ranks' heads
                    raise ModelLoadError("q/k norms over the whole projection (OLMo 2) are "
                                         "not supported with tensor parallelism")
                q_size, kv_size = self.q_size, self.kv_size
            self.q_norm = norm(q_size, eps, parts, f"{prefix}.q_norm")
            self.k_norm = norm(kv_size, eps, parts, f"{prefix}.k_norm")
        scale = (spec.query_scale(config, self.head_size) if spec.query_scale is not None
                 else self.head_size ** -0.5)
        cap = spec.attn_softcap(config) if spec.attn_softcap is not None else None
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_size, float(scale),
                              index, parts, window, float(cap) if cap else None)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_caches: list[torch.Tensor],
                metadata: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm_projection:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.reshape(q.shape[0], -1, self.head_size)
        k = k.reshape(k.shape[0], -1, self.head_size)
        if self.q_norm is not None and not self.qk_norm_projection:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            q, k = self.rotary(positions, q, k)
        return self.o_proj(self.attn(q, k, v, kv_caches, metadata))


class DecoderLayer(nn.Module):
    """One layer; its norms are attributes named as the checkpoint names them.

    The residual stream travels as ``(x, residual)`` whose sum is the hidden state
    (``residual=None``: zero), so a pre-branch norm adds and normalises in one op
    (``fused_add_rms_norm`` rounds the sum to the model dtype, as transformers'
    ``residual + hidden`` does).
    """

    def __init__(self, config: Any, index: int, parts: ModelParts, prefix: str,
                 spec: DecoderSpec, rotary: RotaryEmbedding | None, window: int | None) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(config, index, parts, f"{prefix}.self_attn", spec,
                                          rotary, window)
        self.mlp = MLP_KINDS[spec.mlp](config, parts, f"{prefix}.mlp", spec)
        self._roles: dict[str, str] = {}
        norm = NORM_KINDS[spec.norm]
        for role, name in spec.norms.names():
            setattr(self, name, norm(config.hidden_size, spec.norm_eps(config), parts,
                                     f"{prefix}.{name}"))
            self._roles[role] = name
        self.residual_scale = config_number(spec.residual_scale, config)
        form = FUSED_FORMS[spec.fused] if spec.fused is not None else None
        # A form describes rotary layers with a gated MLP, norms before both branches and
        # unscaled residual adds only, and uncapped attention scores; other layers run
        # their modules. A form without per-layer windows attends to the whole context,
        # so a windowed layer runs it only in steps within the window (FusedLayer.fits).
        applies = (form is not None and rotary is not None and self.residual_scale is None
                   and not self.self_attn.qk_norm_projection
                   and self.self_attn.attn.spec.logits_soft_cap is None
                   and hasattr(self.mlp, "fused_parts") and "pre_attn" in self._roles
                   and "pre_mlp" in self._roles)
        describe = form.describe if form is not None else None
        self.fused = FusedLayer(form.layer_op(parts.ops) if form is not None else None, parts,
                                applies, lambda: describe(self),  # type: ignore[misc]
                                window=None if form is None or form.per_layer_window
                                else window)

    def norm(self, role: str) -> Any:
        """The norm in ``role`` (``pre_attn``, ``post_attn``, ``pre_mlp``, ``post_mlp``) or None."""
        name = self._roles.get(role)
        return getattr(self, name) if name is not None else None

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(branch output, residual)``. ``keep``: the token rows to carry past attention
        (see CausalLM.forward)."""
        if self.fused.runs and keep is None and self.fused.fits(metadata):
            attn = self.self_attn.attn
            out = self.fused.fn(positions, x, residual, self.fused.weights(),
                                kv_caches[attn.layer_index], metadata, attn.spec)
            if out is not None:
                return out
        pre = self.norm("pre_attn")
        if pre is not None:
            if residual is None:
                residual, x = x, pre(x)
            else:
                x, residual = pre(x, residual)
        else:
            residual = x = x if residual is None else x + residual
        x = self.self_attn(positions, x, kv_caches, metadata)
        x, residual = prune_rows(keep, x, residual)
        x = self._branch_out(x, "post_attn")
        pre = self.norm("pre_mlp")
        if pre is not None:
            x, residual = pre(x, residual)
        else:
            residual = x = x + residual
        return self._branch_out(self.mlp(x), "post_mlp"), residual

    def _branch_out(self, x: torch.Tensor, role: str) -> torch.Tensor:
        post = self.norm(role)
        if post is not None:
            x = post(x)
        return x * self.residual_scale if self.residual_scale is not None else x


def _rope_key(settings: RopeSettings) -> str:
    return json.dumps(settings, sort_keys=True, default=str)


class DecoderModel(nn.Module):
    """Embeddings, this pipeline stage's layers, the final norm."""

    def __init__(self, config: Any, parts: ModelParts, spec: DecoderSpec) -> None:
        super().__init__()
        if spec.check is not None:
            spec.check(config)
        h = config.hidden_size
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, h, parts,
                                                   "model.embed_tokens")
        scale = config_number(spec.embed_scale, config)
        if scale is not None and spec.embed_scale_in_dtype:
            self.register_buffer("embed_scale", torch.tensor(scale, dtype=parts.dtype),
                                 persistent=False)
        else:
            self.embed_scale: torch.Tensor | float | None = scale
        self.layer_types = spec.layer_types(config)
        head = getattr(config, "head_dim", None) or h // config.num_attention_heads
        rotary: dict[str, RotaryEmbedding] = {}
        trained = int(config.max_position_embeddings)
        # The context the engine serves fixes the length-dependent scalings (dynamic NTK,
        # LongRoPE's factor set); the table covers it and the positions the scaling serves.
        context = parts.max_model_len or max_positions(config, trained)
        positions = max(trained, context)

        def layer(i: int) -> DecoderLayer:
            settings = spec.rope(config, i, self.layer_types[i])
            table = None
            if settings is not None:
                key = _rope_key(settings)
                if key not in rotary:
                    rotary[key] = RotaryEmbedding(head, rotary_dim(config, head), positions,
                                                  settings[0], True, settings[1], parts,
                                                  trained_positions=trained,
                                                  context_len=context)
                table = rotary[key]
            window = getattr(config, "sliding_window", None) \
                if self.layer_types[i] == SLIDING else None
            # A window as long as the served context hides no key (a query at q sees
            # p > q - window): the layer attends in full and keeps the fused forms.
            window = int(window) if window and int(window) < context else None
            return DecoderLayer(config, i, parts, f"model.layers.{i}", spec, table, window)

        self.parallel = parts.parallel
        # A pipeline stage builds its own layers only (placeholders keep indices global).
        self.layers = own_layers(layer, config.num_hidden_layers, parts.parallel)
        self.own = [la for la in self.layers if not isinstance(la, PPMissingLayer)]
        form = FUSED_FORMS[spec.fused] if spec.fused is not None else None
        self._stack_with_residual = form is not None and form.stack_with_residual
        self.stack = FusedStack(form.stack_op(parts.ops) if form is not None else None,
                                [la.fused for la in self.own],
                                [la.self_attn.attn for la in self.own],
                                per_layer_window=form is not None and form.per_layer_window)
        self.norm = NORM_KINDS[spec.norm](h, spec.norm_eps(config), parts, "model.norm")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                output_rows: torch.Tensor | None = None,
                intermediate: dict[str, torch.Tensor] | None = None
                ) -> torch.Tensor | dict[str, torch.Tensor]:
        """``intermediate``: the previous pipeline stage's hidden state and residual; a
        stage other than the last returns its own as that dict."""
        if intermediate is None:
            x = self.embed_tokens(input_ids)
            if self.embed_scale is not None:
                x = x * self.embed_scale
            residual = None
        else:
            x, residual = intermediate["hidden"], intermediate["residual"]
        last = self.parallel.is_last_stage
        prune = output_rows is not None and last
        out = None
        if residual is None or self._stack_with_residual:
            out = self.stack(positions, x, residual, kv_caches=kv_caches, metadata=metadata,
                             skip_last=prune)
        if out is not None:
            x, residual = out
        else:
            for layer in self.own[:-1] if prune else self.own:
                x, residual = layer(positions, x, residual, kv_caches, metadata)
        if prune:
            x, residual = self.own[-1](positions, x, residual, kv_caches, metadata,
                                       output_rows)
        if not last:
            return {"hidden": x, "residual": residual}
        x, _ = self.norm(x, residual)
        return x


def check_kinds(spec: DecoderSpec) -> None:
    """Every kind a declaration names is registered (raises ``ValueError`` naming the
    field): checked when a family class is declared, so a misspelt kind fails at import."""
    for kind, table, what in ((spec.norm, NORM_KINDS, "norm"), (spec.mlp, MLP_KINDS, "mlp"),
                              (spec.head, HEAD_KINDS, "head")):
        if kind not in table:
            raise ValueError(f"DecoderSpec {what}={kind!r} is not one of {sorted(table)}")
    if spec.fused is not None and spec.fused not in FUSED_FORMS:
        raise ValueError(f"DecoderSpec fused={spec.fused!r} is not one of {sorted(FUSED_FORMS)}")


class DecoderLM(CausalLM):
    """A causal LM of the shared decoder: a subclass sets ``family`` and nothing else.

    The parameter names are the checkpoint's (``model.layers.{i}.self_attn.qkv_proj``,
    ``lm_head``), which weight loading, GGUF renaming and quantization methods key on.
    """

    family: ClassVar[DecoderSpec] = DecoderSpec()
    lm_head: ParallelLMHead
    #: the LM head shares the embedding (the checkpoint's ``lm_head.weight`` is skipped)
    tied: bool

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The loader reads these from the class, before a model is built.
        super().__init_subclass__(**kwargs)
        spec = cls.family
        check_kinds(spec)
        cls.stacked_params = list(spec.stacked)
        #: sliding layers attend within ``config.sliding_window`` (the backend masks the
        #: rest), so the window does not bound the context (``resolve_max_model_len``).
        cls.sliding_window_attention = spec.layer_types is not all_full

    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__()
        spec = self.family
        self.model = DecoderModel(config, parts, spec)
        self.tied = False
        self._output = HEAD_KINDS[spec.head](self, config, parts, spec)
        attn = self.model.own[0].self_attn
        self.num_layers = config.num_hidden_layers
        self.kv_layers = [la.self_attn.attn.layer_index for la in self.model.own]
        self.num_kv_heads = attn.attn.spec.num_kv_heads
        self.head_size = attn.head_size

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                output_rows: torch.Tensor | None = None,
                intermediate: dict[str, torch.Tensor] | None = None
                ) -> torch.Tensor | dict[str, torch.Tensor]:
        return self.model(input_ids, positions, kv_caches, metadata, output_rows, intermediate)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._output(hidden)

    def rename(self, name: str) -> str | None:
        spec = self.family
        if any(s in name for s in spec.skip) or (self.tied and name == "lm_head.weight"):
            return None
        for old, new in spec.renames:
            name = name.replace(old, new)
        return name
