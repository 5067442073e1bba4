"""The linear interface: how a layer's weight is stored and multiplied, and the
implementations the measured choice times against each other.

:class:`LinearMethod` is what every linear representation implements (core's dense
one here, the quantized formats in :mod:`glowlm.layers.quantization`, a plugin's
own); :class:`LinearCandidate` is one implementation of its matmul that the
per-shape choice (:mod:`glowlm.layers.linear_choice`) may pick. Both sit on the
interfaces floor, below the layers, so a platform can name its methods and a layer
can hold one without either importing the other (docs/architecture.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _always(layer: nn.Module) -> bool:
    return True


@dataclass(frozen=True)
class LinearCandidate:
    """One implementation of ``x @ W^T + b`` for a layer.

    ``apply(layer, x, bias)`` computes it from the layer's own parameters (a dense
    candidate reads ``layer.weight``; a quantized one its packed tensors), for ``x`` of
    shape ``[rows, in]``. ``version`` is part of the cache key: change it when the
    kernel changes (glowlm's holds its source hash). ``supports(layer)`` says whether
    it runs this layer at all. ``fused`` marks the kernel the platform's fused ops run
    (see the module docstring). ``finalize(layer)``, if given, runs once for each
    layer that uses only this candidate after the choice (e.g. a weight prepack that
    would break the other candidates). ``release(layer)``, if given, runs for each
    layer that does not use it (e.g. to drop a copy in its own layout made while
    measuring).
    """

    name: str
    version: str
    apply: Callable[[nn.Module, torch.Tensor, torch.Tensor | None], torch.Tensor]
    supports: Callable[[nn.Module], bool] = _always
    fused: bool = False
    finalize: Callable[[nn.Module], None] | None = None
    release: Callable[[nn.Module], None] | None = None
    prepare: Callable[[nn.Module], None] | None = None
    copy_bytes: Callable[[nn.Module], int] | None = None


def _torch_apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
                 ) -> torch.Tensor:
    return F.linear(x, layer.weight, bias)


def is_dense(layer: nn.Module) -> bool:
    w = getattr(layer, "weight", None)
    return isinstance(w, torch.Tensor) and w.dim() == 2 and w.layout == torch.strided


#: torch's ``F.linear`` (oneDNN/MKL on x86: AVX512-BF16 and AMX where the CPU has them).
TORCH_LINEAR = LinearCandidate(
    "torch", f"{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}",
    _torch_apply, is_dense)


_ONEDNN_DTYPES = (torch.bfloat16, torch.float32)


def _onednn_ops() -> tuple[Any, Any] | None:
    """(reorder, linear) from torch's oneDNN bindings, or ``None`` where this torch lacks
    them (a build without mkldnn)."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return (torch.ops.mkldnn._reorder_linear_weight, torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return None


def onednn_weight(layer: nn.Module) -> torch.Tensor:
    """``layer``'s weight in oneDNN's blocked layout: the weight itself once
    :func:`_onednn_finalize` replaced it, else a copy made on first use."""
    w = layer.weight
    if w.is_mkldnn:
        return w
    packed = layer.__dict__.get("onednn_weight")
    if packed is None:
        ops = _onednn_ops()
        assert ops is not None
        packed = ops[0](w.detach(), None)
        layer.__dict__["onednn_weight"] = packed
    return packed


def _onednn_apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
                  ) -> torch.Tensor:
    linear = torch.ops.mkldnn._linear_pointwise
    w = onednn_weight(layer)
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    y = linear(x2, w, bias, "none", [], "")
    return y.reshape(*x.shape[:-1], y.shape[-1])


def _onednn_bf16() -> bool:
    """Whether oneDNN runs bf16 here: it refuses bf16 weights on CPUs without AVX-512
    (BW/VL/DQ) or AVX-NE-CONVERT (an AVX2-only Zen 2/3, for instance)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _onednn_supports(layer: nn.Module) -> bool:
    w = getattr(layer, "weight", None)
    return (isinstance(w, torch.Tensor) and w.dim() == 2 and w.dtype in _ONEDNN_DTYPES
            and (w.dtype != torch.bfloat16 or _onednn_bf16())
            and (w.is_mkldnn or w.layout == torch.strided))


def _onednn_finalize(layer: nn.Module) -> None:
    """The layer runs oneDNN for every class: its packed weight replaces the plain
    one, so it holds one copy (its method's own ``apply`` can no longer run)."""
    packed = onednn_weight(layer)
    layer.weight = nn.Parameter(packed, requires_grad=False)
    layer.__dict__.pop("onednn_weight", None)


def _onednn_release(layer: nn.Module) -> None:
    layer.__dict__.pop("onednn_weight", None)


def _onednn_copy_bytes(layer: nn.Module) -> int:
    w = layer.weight
    return 0 if w.is_mkldnn else w.numel() * w.element_size()


#: torch's oneDNN GEMM on a weight reordered once into oneDNN's blocked layout (the
#: prepack ``F.linear`` redoes, or does without, on every call): 1.3-2x ``F.linear``
#: at 4-64 rows. Where it shares a layer with another candidate it keeps its own copy.
ONEDNN_LINEAR = LinearCandidate(
    "onednn", f"{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}",
    _onednn_apply, _onednn_supports, finalize=_onednn_finalize, release=_onednn_release,
    prepare=onednn_weight, copy_bytes=_onednn_copy_bytes)


def onednn_candidates() -> list[LinearCandidate]:
    """``[ONEDNN_LINEAR]`` where this torch has oneDNN's linear bindings, else ``[]``: a
    dense method lists it beside :data:`TORCH_LINEAR`."""
    return [ONEDNN_LINEAR] if _onednn_ops() is not None else []



class LinearMethod(ABC):
    """How a linear layer stores its weight and computes ``x @ W^T + b``.

    Instances are shared by layers; per-layer state lives on the layer. All three
    methods run in the engine process (each worker rank): ``create_weights`` at
    model construction, ``process_weights_after_loading`` once after the
    checkpoint is read (repack, quantize, prepack: it may replace parameters),
    ``apply`` on every forward.
    """

    @abstractmethod
    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: Sequence[int], params_dtype: torch.dtype
                       ) -> None:
        """Register this rank's parameters on ``layer`` (uninitialised; loading fills them).

        ``input_size`` and ``output_partition_sizes`` are per-rank sizes; each
        parameter gets ``output_dim``/``input_dim`` attributes so weight loaders
        know which axis to shard.
        """

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Turn loaded weights into the form :meth:`apply` wants (default: nothing)."""
        return None

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor:
        """``x``: ``[tokens, input_size]`` -> ``[tokens, sum(output_partition_sizes)]``."""

    def linear_candidates(self, layer: nn.Module) -> list[LinearCandidate]:
        """Implementations of :meth:`apply` for ``layer`` that the measured choice may
        time against each other at load (:mod:`glowlm.layers.linear_choice`); the first
        is the default. Empty (the default): ``apply`` runs as written, never measured.
        """
        return []


class UnquantizedLinearMethod(LinearMethod):
    """Dense weights in the model dtype, multiplied by torch's GEMM."""

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: Sequence[int], params_dtype: torch.dtype
                       ) -> None:
        weight = nn.Parameter(torch.empty(sum(output_partition_sizes), input_size,
                                          dtype=params_dtype), requires_grad=False)
        weight.output_dim, weight.input_dim = 0, 1  # type: ignore[attr-defined]
        layer.register_parameter("weight", weight)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)

    def linear_candidates(self, layer: nn.Module) -> list[LinearCandidate]:
        return [TORCH_LINEAR, *onednn_candidates()]
