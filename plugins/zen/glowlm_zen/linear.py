"""Dense linear layers on zentorch's ZenDNN kernels.

Tested wherever zentorch imports (plugins/zen/tests/test_zentorch_linear.py; it
installs from PyPI on any x86_64 Linux, and runs on AMD Zen 4/5). It is written
defensively: the zentorch operators are looked up by name at
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


def _zentorch_weight(layer: nn.Module) -> bool:
    w = getattr(layer, "weight", None)
    return (isinstance(w, torch.Tensor) and w.dim() == 2
            and w.dtype in (torch.bfloat16, torch.float32))


def _zentorch_version() -> str:
    try:
        from importlib import metadata

        return metadata.version("zentorch")
    except Exception:  # noqa: BLE001 - only a cache key
        return "unknown"


class ZentorchLinearMethod(UnquantizedLinearMethod):
    """Dense weights, optionally prepacked into ZenDNN's blocked layout.

    ``prepack`` comes from ``GLOWLM_ZENTORCH_WEIGHT_PREPACK`` (via the platform): a
    one-time repack that makes every later GEMM cheaper, but leaves a weight only
    zentorch can read. So with the measured choice (``measured=True``,
    :mod:`glowlm.layers.linear_choice`) loading keeps plain weights — the other
    candidates, glowlm's kernels (``glowlm``, given by the platform when they loaded)
    and torch's ``F.linear``, need them — and the choice prepacks only the layers that
    use zentorch for every token class (the candidate's ``finalize``). Without it
    (``GLOWLM_LINEAR_IMPL=default``) every layer is prepacked at load, as before.
    Weights are created exactly like core's unquantized method, so checkpoints load
    the same way.
    """

    def __init__(self, prepack: bool = True, measured: bool = False,
                 glowlm: LinearCandidate | None = None, policy: object | None = None) -> None:
        self.prepack = prepack
        self.measured = measured
        self.glowlm = glowlm
        #: The GEMV/GEMM policy of the x86 fused ops (glowlm_x86.platform.ops), which a
        #: Zen engine may run where the measured choice picked glowlm's kernels.
        self.policy = policy
        self.runs_fused_kernels = measured and glowlm is not None and policy is not None
        self._linear = _zentorch_op("zentorch_linear_unary")
        self._prepack = _zentorch_op("zentorch_weight_prepack_for_linear") if prepack else None
        if self._linear is None:
            logger.warning("zentorch has no zentorch_linear_unary operator; linear layers "
                           "use torch's F.linear (oneDNN) instead")

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.zentorch_prepacked = False
        if not self.measured:
            self.prepack_layer(layer)

    def prepack_layer(self, layer: nn.Module) -> None:
        """Repack ``layer.weight`` for ZenDNN (once; nothing without the operator)."""
        if (self._linear is None or self._prepack is None
                or getattr(layer, "zentorch_prepacked", False)):
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

    def linear_candidates(self, layer: nn.Module) -> list[LinearCandidate]:
        """zentorch (the default), glowlm's kernels when the platform gave them, torch."""
        out: list[LinearCandidate] = []
        if self._linear is not None:
            out.append(LinearCandidate(
                "zentorch", f"{_zentorch_version()}-prepack{int(self._prepack is not None)}",
                self.apply, _zentorch_weight,
                finalize=self.prepack_layer if self._prepack is not None else None))
        if self.glowlm is not None:
            out.append(self.glowlm)
        out.append(TORCH_LINEAR)
        return out
