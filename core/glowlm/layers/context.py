"""What every layer is built with: the platform's parts, passed explicitly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from glowlm.distributed.parallel import ParallelState
from glowlm.ops.table import REFERENCE_OPS, OpsTable

if TYPE_CHECKING:
    from glowlm.attention.backend import AttentionBackend
    from glowlm.layers.quantization import QuantizationConfig
    from glowlm.lora.slots import LoRAState
    from glowlm.ops.linear import LinearMethod


@dataclass
class ModelParts:
    """Chosen once per engine from the platform and the checkpoint; read by layers.

    ``linear_method(prefix)`` returns the method for the linear layer at that
    weight prefix: the quantization config's choice, or the platform's
    unquantized method.
    """

    dtype: torch.dtype
    ops: OpsTable = REFERENCE_OPS
    attention_backend: AttentionBackend | None = None
    quant_config: QuantizationConfig | None = None
    unquantized: LinearMethod | None = None
    parallel: ParallelState = field(default_factory=ParallelState)
    #: --enable-expert-parallel: MoE layers hold whole experts per TP rank
    #: (:class:`glowlm.layers.moe.FusedMoE`), not a slice of every expert.
    expert_parallel: bool = False
    #: The context the engine serves (``--max-model-len``, else the model's): rotary
    #: tables hold that many positions, and the length-dependent RoPE scalings (dynamic
    #: NTK, LongRoPE's short/long factors) are fixed by it. None: the config's.
    max_model_len: int | None = None
    #: --enable-lora: every decoder linear layer holds adapter slots and reads the step's
    #: row -> slot mapping from here (:mod:`glowlm.lora.slots`). None: no adapters.
    lora: LoRAState | None = None

    def linear_method(self, prefix: str) -> LinearMethod:
        if self.quant_config is not None:
            method = self.quant_config.linear_method(prefix)
            if method is not None:
                return method
        if self.unquantized is None:
            from glowlm.ops.linear import UnquantizedLinearMethod

            self.unquantized = UnquantizedLinearMethod()
        return self.unquantized
