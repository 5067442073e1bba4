"""The set of replaceable ops a platform hands to the model layers.

Layers call ``ops.rms_norm(...)`` on the table their platform gave them, never a
kernel library directly, so a plugin swaps implementations without touching
models. Every field has the signature of the function of the same name in
:mod:`glowlm.ops.reference`, except the optional fused layer and stack ops (see
:mod:`glowlm.ops.fused`), which are ``None`` unless a platform provides them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, fields

from glowlm.ops import reference


@dataclass(frozen=True)
class OpsTable:
    rms_norm: Callable = reference.rms_norm
    fused_add_rms_norm: Callable = reference.fused_add_rms_norm
    layer_norm: Callable = reference.layer_norm
    rotary_embedding: Callable = reference.rotary_embedding
    silu_and_mul: Callable = reference.silu_and_mul
    #: A platform without its own keeps core's (the field's default).
    gelu_tanh_and_mul: Callable = reference.gelu_tanh_and_mul
    gelu: Callable = reference.gelu
    gelu_tanh: Callable = reference.gelu_tanh
    relu: Callable = reference.relu
    dense_linear: Callable = reference.dense_linear
    #: A mixture-of-experts MLP's routed experts (``reference.fused_moe``'s signature).
    fused_moe: Callable = reference.fused_moe
    #: LoRA adapters' updates after a linear layer's base matmul
    #: (``reference.lora_shrink_expand``'s signature; :mod:`glowlm.lora.slots`).
    lora_shrink_expand: Callable = reference.lora_shrink_expand
    #: A whole pre-LayerNorm decoder layer (OPT, GPT-2): ``glowlm.ops.fused.LnDecoderLayerFn``.
    ln_decoder_layer: Callable | None = None
    #: A whole RMSNorm decoder layer (Llama family): ``glowlm.ops.fused.RmsDecoderLayerFn``.
    rms_decoder_layer: Callable | None = None
    #: Every pre-LayerNorm layer in one call: ``glowlm.ops.fused.LnDecoderStackFn``.
    ln_decoder_stack: Callable | None = None
    #: Every RMSNorm layer in one call: ``glowlm.ops.fused.RmsDecoderStackFn``.
    rms_decoder_stack: Callable | None = None
    #: Any layer described by ``glowlm.ops.fused.DecoderLayerWeights``, one per call:
    #: ``glowlm.ops.fused.DecoderLayerFn``. Optional even then: without it, such layers
    #: use ``ln_decoder_layer``/``rms_decoder_layer`` when they fit those forms.
    decoder_layer: Callable | None = None
    #: Consecutive ``DecoderLayerWeights`` layers in one call: ``DecoderStackFn``.
    decoder_stack: Callable | None = None
    #: The shared-memory all-reduce in compiled code, ``fn(x, state)``: sums the
    #: contiguous float tensor ``x`` over the group whose
    #: :meth:`glowlm.distributed.shm.ShmGroup.native_state` is ``state``, in place, with
    #: the Python path's protocol and bits; raises ``RuntimeError`` when the group was
    #: stopped. A tensor-parallel rank's group uses it for every all-reduce outside the
    #: fused stacks (module-by-module layers, the embedding) when the platform has one.
    shm_all_reduce: Callable | None = None

    def without_fused(self) -> OpsTable:
        """This table with every fused layer and stack op removed (``GLOWLM_NO_FUSED_LAYERS``)."""
        return dataclasses.replace(self, **{name: None for name in FUSED_OPS})

    def replaced(self) -> list[str]:
        """Names of ops that differ from core's reference (for start-up reports)."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not getattr(
            REFERENCE_OPS, f.name)]


REFERENCE_OPS = OpsTable()

#: The optional whole-layer and whole-stack slots (``None`` in the reference table).
FUSED_OPS = ("ln_decoder_layer", "rms_decoder_layer", "ln_decoder_stack", "rms_decoder_stack",
             "decoder_layer", "decoder_stack")
