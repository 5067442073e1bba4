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
from glowlm.plugin_api import (
    TORCH_LINEAR,
    LinearCandidate,
    UnquantizedLinearMethod,
    init_logger,
    onednn_candidates,
)
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
    """Dense weights for zentorch's linear, which needs its own weight layout.

    zentorch 2.13's ``zentorch_linear_unary`` reads an unpacked weight as ``[in, out]``
    memory (the layout of ``W.t()``), not as the ``[out, in]`` rows a checkpoint
    holds: given a plain weight it returns wrong numbers at most shapes (relative
    error ~1.4 at 1024 x 256, 256 x 1024, 128 x 128; right at 48 x 64;
    ``plugins/zen/tests/test_zentorch_linear.py``). So a weight is always converted:
    prepacked into ZenDNN's blocked layout (``prepack``, from
    ``GLOWLM_ZENTORCH_WEIGHT_PREPACK``, the default: faster GEMMs) or stored
    transposed in place (same shape and bytes, strides ``(1, out)``).

    With the measured choice (``measured=True``, :mod:`glowlm.layers.linear_choice`)
    loading keeps plain weights, which the other candidates — glowlm's kernels
    (``glowlm``, given by the platform when they loaded) and torch's ``F.linear`` —
    read; zentorch is timed on a prepacked copy, and the choice then prepacks in
    place the layers that use zentorch for every token class (``finalize``), keeps a
    prepacked copy beside the plain weight where zentorch wins only some classes
    (that layer's weight memory doubles), and drops the copy elsewhere (``release``).
    Without it (``GLOWLM_LINEAR_IMPL=default``) every layer is converted at load, as
    before. Weights are created exactly like core's unquantized method, so
    checkpoints load the same way.
    """

    def __init__(self, prepack: bool = True, measured: bool = False,
                 glowlm: LinearCandidate | None = None, policy: object | None = None,
                 extra: tuple[LinearCandidate, ...] = ()) -> None:
        self.prepack = prepack
        self.measured = measured
        self.glowlm = glowlm
        #: The x86 plugin's other candidates (its block-packed GEMM where it runs).
        self.extra = extra
        #: The GEMV/GEMM policy of the x86 fused ops (glowlm_x86.platform.ops), which a
        #: Zen engine runs where the measured choice picked glowlm's kernels.
        self.policy = policy
        self.runs_fused_kernels = measured and glowlm is not None and policy is not None
        self._linear = _zentorch_op("zentorch_linear_unary")
        self._prepack = _zentorch_op("zentorch_weight_prepack_for_linear")
        if self._linear is None:
            logger.warning("zentorch has no zentorch_linear_unary operator; linear layers "
                           "use torch's F.linear (oneDNN) instead")

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.zentorch_prepacked = False
        layer.zentorch_transposed = False
        if self.measured or self._linear is None:
            return
        if self.prepack and self._prepack is not None:
            self.prepack_layer(layer)
        else:
            self.transpose_layer(layer)

    def prepack_layer(self, layer: nn.Module) -> None:
        """Repack ``layer.weight`` in place for ZenDNN (once), dropping any copy."""
        if self._prepack is None or getattr(layer, "zentorch_prepacked", False):
            return
        packed = getattr(layer, "zentorch_weight", None)
        if packed is None:
            packed = self._prepack(layer.weight.data)
        layer.weight = nn.Parameter(packed, requires_grad=False)
        layer.zentorch_prepacked = True
        self.drop_copy(layer)

    def transpose_layer(self, layer: nn.Module) -> None:
        """Store ``layer.weight`` transposed in place (``GLOWLM_ZENTORCH_WEIGHT_PREPACK=0``)."""
        if getattr(layer, "zentorch_prepacked", False) or getattr(layer, "zentorch_transposed",
                                                                  False):
            return
        layer.weight = nn.Parameter(layer.weight.data.t().contiguous().t(), requires_grad=False)
        layer.zentorch_transposed = True
        self.drop_copy(layer)

    def copy_bytes(self, layer: nn.Module) -> int:
        """The prepacked copy's size where the layer also keeps its plain weight."""
        if getattr(layer, "zentorch_prepacked", False):
            return 0
        return layer.weight.numel() * layer.weight.element_size()

    def drop_copy(self, layer: nn.Module) -> None:
        if hasattr(layer, "zentorch_weight"):
            del layer.zentorch_weight

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor:
        if self._linear is None:
            return F.linear(x, layer.weight, bias)
        if getattr(layer, "zentorch_prepacked", False):
            return self._linear(x, layer.weight, bias, is_weight_prepacked=True)
        if getattr(layer, "zentorch_transposed", False):
            # zentorch 2.13.0.2 on the transposed weight returned a relative error of 1.4
            # at 7 fp32 rows in a full test run (right when run alone), so the transposed
            # layout (GLOWLM_ZENTORCH_WEIGHT_PREPACK=0) goes to oneDNN, which reads it.
            return F.linear(x, layer.weight, bias)
        return self._apply_copy(layer, x, bias)

    def _apply_copy(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
                    ) -> torch.Tensor:
        """zentorch on a prepacked copy beside the plain weight (made on first use)."""
        packed = getattr(layer, "zentorch_weight", None)
        if packed is None:
            assert self._prepack is not None
            packed = layer.zentorch_weight = self._prepack(layer.weight.data)
        x2 = x.reshape(-1, x.shape[-1])
        y = self._linear(x2, packed, bias, is_weight_prepacked=True)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def linear_candidates(self, layer: nn.Module) -> list[LinearCandidate]:
        """zentorch (the default), glowlm's kernels when the platform gave them (and the
        block-packed GEMM where it runs), oneDNN on a packed weight, ``F.linear``."""
        out: list[LinearCandidate] = []
        if self._linear is not None and self._prepack is not None:
            out.append(LinearCandidate(
                "zentorch", _zentorch_version(), self.apply, _zentorch_weight,
                finalize=self.prepack_layer if self.prepack else self.transpose_layer,
                release=self.drop_copy, copy_bytes=self.copy_bytes))
        if self.glowlm is not None:
            out.append(self.glowlm)
        out += [*self.extra, *onednn_candidates(), TORCH_LINEAR]
        return out
