"""What every quantized linear method shares: checkpoint-shaped parameters, unpacking.

A method's ``create_weights`` declares the tensors exactly as the checkpoint
stores them (packed int32, scales, zero points, group indices), so the loader
copies them without knowing the format; ``process_weights_after_loading`` turns
them into a canonical form (:mod:`.kernels`), hands that to the platform's
kernels to repack once, and drops the checkpoint-shaped parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from glowlm.errors import ModelLoadError
from glowlm.layers.quantization.kernels import (
    ACT_BLOCK,
    Int8Weights,
    QuantKernels,
    WeightOnlyInt,
    int8_weights_as_blocks,
)
from glowlm.logger import init_logger
from glowlm.ops.linear import LinearMethod

if TYPE_CHECKING:
    from glowlm.ops.linear import LinearCandidate

logger = init_logger("glowlm.quantization")

#: AutoAWQ's GEMM layout: nibble i of an int32 holds logical column ORDER[i] of its 8.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def add_param(layer: nn.Module, name: str, shape: Sequence[int], dtype: torch.dtype, *,
              output_dim: int | None = None, input_dim: int | None = None,
              packed_dim: int | None = None, packed_factor: int = 1,
              shard_scalar: bool = False) -> None:
    """Register an uninitialised parameter with the attributes the weight loaders read.

    ``packed_dim``/``packed_factor``: that axis holds ``packed_factor`` values per
    element (an int32 of eight 4-bit values), so shard offsets along it are divided.
    ``shard_scalar``: one value per fused projection (per-tensor scales).
    """
    p = nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
    if output_dim is not None:
        p.output_dim = output_dim  # type: ignore[attr-defined]
    if input_dim is not None:
        p.input_dim = input_dim  # type: ignore[attr-defined]
    if packed_dim is not None:
        p.packed_dim, p.packed_factor = packed_dim, packed_factor  # type: ignore[attr-defined]
    if shard_scalar:
        p.shard_scalar = True  # type: ignore[attr-defined]
    layer.register_parameter(name, p)


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words holding ``32 // bits`` values each, lowest bits first, along ``dim``.

    Returns int32 values in ``[0, 2**bits)``; the unpacked axis is ``32 // bits``
    times longer.
    """
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    p = packed.to(torch.int32).unsqueeze(dim + 1) if dim == 0 else packed.to(torch.int32)
    if dim == 0:  # [R, C] -> [R, per, C]
        vals = (p >> shifts.view(1, per, 1)) & ((1 << bits) - 1)
        return vals.reshape(packed.shape[0] * per, packed.shape[1])
    vals = (p.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)   # [R, C, per]
    return vals.reshape(packed.shape[0], packed.shape[1] * per)


def group_perm(g_idx: torch.Tensor, group_size: int, prefix: str) -> torch.Tensor | None:
    """The column order that makes act-order groups contiguous (None if already so).

    GPTQ's ``desc_act`` quantizes columns in activation order, so column ``k``
    belongs to group ``g_idx[k]`` and groups are scattered; sorting the columns by
    group lets kernels read groups contiguously, with ``x[:, perm]`` at run time.
    """
    g = g_idx.to(torch.int64)
    k = g.numel()
    natural = torch.arange(k, dtype=torch.int64) // group_size
    if torch.equal(g, natural):
        return None
    perm = torch.argsort(g, stable=True)
    if not torch.equal(g[perm], natural):
        raise ModelLoadError(f"{prefix}: g_idx does not give every group {group_size} "
                             "columns; this act-order layout is not supported")
    return perm


def int8_act_block(kernels: QuantKernels, w: WeightOnlyInt, mode: str) -> int:
    """The int8 activation block a weight-only layer ``w`` runs with on ``kernels``:
    ``ACT_BLOCK`` when ``mode`` (``auto``: where that is the kernels' fast path,
    ``QuantKernels.int8_activations``; ``1``; ``0``) asks and the layer allows it (no act
    order, whole blocks of 32 columns, groups of 16 or of a multiple of 32), else 0.

    Why a W4A16 checkpoint may run int8 activations: on CPUs without a bf16 dot product
    (x86 avx2 / avx512 without AVX512_BF16) the A16 path converts every weight to fp32
    and reaches ~60 % of the memory read at decode, and on Zen 4, whose 512-bit bf16 dot
    runs at half rate, the bf16-dot path reaches 75-80 %, while int8 activations
    (four multiply-adds per lane, not two) reach it (docs/quantization.md has the
    figures and the accuracy cost: one int8 rounding of each activation, ~0.6 % relative
    per layer output, below the 4-bit weights' own error)."""
    fits = w.perm is None and w.q.shape[1] % ACT_BLOCK == 0 and groups_fit_blocks(w.group_size)
    return ACT_BLOCK if int8_wanted(kernels, mode) and fits else 0


def int8_wanted(kernels: QuantKernels, mode: str) -> bool:
    """An ``auto`` / ``1`` / ``0`` int8-activation switch on ``kernels`` (auto: where
    int8 is their fast path); GGUF's and the weight-only formats' envs share it."""
    return kernels.int8_activations if mode == "auto" else mode == "1"


def groups_fit_blocks(group: int) -> bool:
    """Whether weight groups of ``group`` columns line up with 32-column activation blocks."""
    return group == 16 or group % ACT_BLOCK == 0


_announced: set[tuple[str, str]] = set()


def _announce(kernels: QuantKernels, key: str, message: str, *args: object) -> None:
    """One line per kernel set and kind: the arithmetic changed, so say so at load."""
    if (kernels.name, key) in _announced:
        return
    _announced.add((kernels.name, key))
    logger.info(message, *args)


class QuantLinearMethod(LinearMethod):
    """Base: the checkpoint's parameters in, a kernel-prepared weight out."""

    #: Names of the checkpoint-shaped parameters dropped after repacking.
    param_names: tuple[str, ...] = ()
    #: Whether ``GLOWLM_WEIGHT_ONLY_INT8_ACTIVATIONS`` decides this method's activation
    #: blocks (AWQ, GPTQ, compressed-tensors); GGUF sets its own (its env, ggml's rule).
    weight_only_int8_env = True

    def __init__(self, kernels: QuantKernels) -> None:
        self.kernels = kernels

    def canonical(self, layer: nn.Module) -> WeightOnlyInt | Int8Weights:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        from glowlm import envs

        canon = self.canonical(layer)
        mode = envs.get().weight_only_int8_activations
        if (isinstance(canon, Int8Weights) and canon.input_scale is None and mode != "0"
                and self.kernels.w8a8_as_blocks and canon.q.shape[1] % ACT_BLOCK == 0):
            canon = int8_weights_as_blocks(canon)
            _announce(self.kernels, "w8a8",
                      "dynamic W8A8 layers: activations quantized to int8 per %d columns, not "
                      "per token (the %s kernels' fast path on this CPU; "
                      "GLOWLM_WEIGHT_ONLY_INT8_ACTIVATIONS=0 keeps per-token scales)",
                      ACT_BLOCK, self.kernels.name)
        elif (isinstance(canon, WeightOnlyInt) and self.weight_only_int8_env
              and not canon.act_block):
            canon.act_block = int8_act_block(self.kernels, canon, mode)
            if canon.act_block:
                why = (f"the {self.kernels.name} kernels' fast path on this CPU"
                       if mode == "auto" else "GLOWLM_WEIGHT_ONLY_INT8_ACTIVATIONS=1")
                _announce(self.kernels, mode,
                          "weight-only quantized layers: activations quantized to int8 per "
                          "%d columns (%s; GLOWLM_WEIGHT_ONLY_INT8_ACTIVATIONS=0 keeps the "
                          "checkpoint's 16-bit activations)", ACT_BLOCK, why)
        for name in self.param_names:
            if hasattr(layer, name):
                delattr(layer, name)
        #: which kernel call the prepared weight is for (W8A8 may run as blocks)
        layer.quant_w8a8 = isinstance(canon, Int8Weights)
        if layer.quant_w8a8:
            layer.quant_weight = self.kernels.prepare_w8a8(canon)
        else:
            layer.quant_weight = self.kernels.prepare_weight_only(canon)

    def linear_candidates(self, layer: nn.Module) -> list[LinearCandidate]:
        """This method's kernels first, then torch's implementations of the same
        arithmetic where they run the layer (:mod:`.candidates`); the measured linear
        choice times them per shape and token class."""
        from glowlm.layers.quantization.candidates import quant_candidates

        return quant_candidates(self, layer)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor:
        if getattr(layer, "quant_w8a8", isinstance(self, W8A8Mixin)):
            return self.kernels.w8a8(x, layer.quant_weight, bias)
        return self.kernels.weight_only(x, layer.quant_weight, bias)


class W8A8Mixin:
    """Marks a method whose canonical form is :class:`Int8Weights`."""


def check_divisible(value: int, by: int, what: str, prefix: str) -> None:
    if by <= 0 or value % by:
        raise ModelLoadError(f"{prefix}: {what} {value} is not a multiple of {by}")
