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

    def linear_method(self, prefix: str) -> LinearMethod:
        if self.quant_config is not None:
            method = self.quant_config.linear_method(prefix)
            if method is not None:
                return method
        if self.unquantized is None:
            from glowlm.ops.linear import UnquantizedLinearMethod

            self.unquantized = UnquantizedLinearMethod()
        return self.unquantized
