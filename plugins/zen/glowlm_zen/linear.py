"""Dense linear layers on zentorch's ZenDNN kernels.

Untested here: zentorch only installs and runs on AMD Zen hosts, and glowlm's CI
has none, so this module is exercised only on real Zen 4/5 machines. It is
written defensively: the zentorch operators are looked up by name at
load time, and if the installed zentorch lacks them the layer keeps torch's
``F.linear`` (oneDNN) and says so once, instead of failing mid-request.

The operator names are those zentorch registers under ``torch.ops.zentorch``
(``zentorch_linear_unary`` for ``x @ W^T + b``, ``zentorch_weight_prepack_for_linear``
for the blocked weight layout); they have changed between zentorch releases,
hence the lookup.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from glowlm.plugin_api import UnquantizedLinearMethod, init_logger
from torch import nn

logger = init_logger(__name__)


def _zentorch_op(name: str):
    """``torch.ops.zentorch.<name>`` after importing zentorch, or ``None``."""
    try:
        import zentorch  # noqa: F401 - registers torch.ops.zentorch
    except ImportError:
        return None
    try:
        return getattr(torch.ops.zentorch, name)
    except (AttributeError, RuntimeError):
        return None


class ZentorchLinearMethod(UnquantizedLinearMethod):
    """Dense weights, optionally prepacked into ZenDNN's blocked layout at load.

    ``prepack`` comes from ``GLOWLM_ZENTORCH_WEIGHT_PREPACK`` (via the platform):
    a one-time repack after loading that makes every later GEMM cheaper. Weights
    are created exactly like core's unquantized method, so checkpoints load the
    same way; only :meth:`process_weights_after_loading` and :meth:`apply` differ.
    """

    def __init__(self, prepack: bool = True) -> None:
        self.prepack = prepack
        self._linear = _zentorch_op("zentorch_linear_unary")
        self._prepack = _zentorch_op("zentorch_weight_prepack_for_linear") if prepack else None
        if self._linear is None:
            logger.warning("zentorch has no zentorch_linear_unary operator; linear layers "
                           "use torch's F.linear (oneDNN) instead")

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.zentorch_prepacked = False
        if self._linear is None or self._prepack is None:
            return
        packed = self._prepack(layer.weight.data)
        layer.weight = nn.Parameter(packed, requires_grad=False)
        layer.zentorch_prepacked = True

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor:
        if self._linear is None:
            return F.linear(x, layer.weight, bias)
        return self._linear(x, layer.weight, bias,
                            is_weight_prepacked=getattr(layer, "zentorch_prepacked", False))
