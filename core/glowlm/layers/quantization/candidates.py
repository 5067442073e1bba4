"""Other implementations of a quantized layer's matmul, for the measured linear choice.

A quantized layer runs its kernel set's matmul (a plugin's compiled kernels, or core's
reference): that is the incumbent. :mod:`glowlm.layers.linear_choice` times it, per
shape and token class, against these implementations of the *same* arithmetic, which
torch ships on every CPU build:

- ``torch-int8`` (W8A8, per-token dynamic or static activations): the activations
  quantized by the kernel set itself (``QuantKernels.int8_activations_of``: the
  integers its ``w8a8`` sums, bit for bit, in one compiled pass), then
  ``torch._int_mm`` — oneDNN's int8 GEMM, with AMX-INT8 on Sapphire Rapids and later and
  VNNI elsewhere — and the kernels' scaling order. Its int32 sums are the kernels'
  exactly, so only fp32 rounding of the epilogue can differ.
- ``torch-int4`` (4-bit weight-only, groups of 32-256, 16-bit models): torch's int4
  weight-only GEMM (``_weight_int4pack_mm_for_cpu``) on the model-dtype activations —
  the checkpoint's own W4A16 arithmetic. Where the kernels quantize activations to int8
  (x86 without AVX512_BF16) it is the more exact of the two; its kernel takes the
  scales in the activations' dtype, so they are rounded to bf16 / fp16 (a relative
  2**-9 / 2**-12 per group, far below the 4-bit weights' own error).

Each keeps its own copy of the weights in its layout, made when first measured
(``prepare``), dropped from the layers that do not use it (``release``) and counted
against the memory plan's spare bytes (``copy_bytes``); the kernels' packed weights
stay, since decode keeps running them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from glowlm.layers.quantization.kernels import REFERENCE_KERNELS
from glowlm.ops.linear import LinearCandidate

if TYPE_CHECKING:
    from glowlm.layers.quantization.kernels import QuantKernels


class QuantLinearMethod(Protocol):
    """What these candidates read of a quantized method (:class:`~glowlm.layers.
    quantization.method.QuantLinearMethod`, or a plugin's method with a kernel set):
    written as a protocol so this module and the method's do not import each other."""

    kernels: QuantKernels

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor: ...

#: Group sizes torch's int4 weight-only GEMM takes.
INT4_GROUPS = frozenset({32, 64, 128, 256})
_INT8 = "torch_int8_weight"
_INT4 = "torch_int4_weight"


def incumbent(method: QuantLinearMethod) -> LinearCandidate:
    """The method's own kernels (the default, and the reference of the output check).

    ``fused`` for a compiled kernel set: a platform's fused decoder ops run the same
    prepared weights with the same kernels (x86's stack runs weight-only and W8A8
    projections), so they stay on for the classes where these kernels win."""
    kernels = method.kernels
    compiled = kernels is not REFERENCE_KERNELS
    return LinearCandidate("glowlm-quant" if compiled else "reference-quant",
                           getattr(kernels, "version", kernels.name),
                           lambda layer, x, bias: method.apply(layer, x, bias), fused=compiled)


def _w8a8(layer: nn.Module) -> bool:
    return bool(getattr(layer, "quant_w8a8", False)) and hasattr(torch, "_int_mm")


def _int8_operands(kernels: QuantKernels, layer: nn.Module) -> dict[str, Any]:
    ops = layer.__dict__.get(_INT8)
    if ops is None:
        w = kernels.int8_weights(layer.quant_weight)
        q = w.q[:, :layer.input_size]
        zp = int(w.input_zero_point)
        ops = {"wt": q.t().contiguous(), "scale": w.weight_scale.float().contiguous(),
               "zp": zp,
               "colsum": q.sum(1, dtype=torch.int32) if zp else None}
        layer.__dict__[_INT8] = ops
    return ops


def _int8_apply(kernels: QuantKernels) -> Any:
    def apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ops = _int8_operands(kernels, layer)
        x2 = x.reshape(-1, x.shape[-1])
        q, sx = kernels.int8_activations_of(x2, layer.quant_weight)
        acc = torch._int_mm(q, ops["wt"])
        if ops["colsum"] is not None:  # static asymmetric: sum((q - zp) w)
            acc = acc - ops["zp"] * ops["colsum"]
        y = (sx * ops["scale"]) * acc.float()  # the kernels' order: sx * ws * sum
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype).reshape(*x.shape[:-1], -1)
    return apply


def _int4_ok(layer: nn.Module) -> bool:
    p = getattr(layer, "quant_weight", None)
    return (not getattr(layer, "quant_w8a8", True) and getattr(p, "bits", 0) == 4
            and getattr(p, "group_size", 0) in INT4_GROUPS
            and getattr(layer, "params_dtype", None) in (torch.bfloat16, torch.float16)
            and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"))


def _int4_operands(kernels: QuantKernels, layer: nn.Module) -> dict[str, Any]:
    ops = layer.__dict__.get(_INT4)
    if ops is None:
        parts = kernels.weight_only_parts(layer.quant_weight)
        n = parts.q.shape[0]
        pad = (-n) % 16  # torch's int4 packing takes whole blocks of 16 output rows
        q = F.pad(parts.q.to(torch.int32), (0, 0, 0, pad))
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)
        # torch's form: w = (q - 8) * s + z, so z = 8 s - zero * s.
        scales = F.pad(parts.scales, (0, 0, 0, pad))
        zero = 8.0 * scales - F.pad(parts.zs, (0, 0, 0, pad))
        sz = torch.stack([scales, zero], dim=-1).transpose(0, 1)  # [G, Npad, 2]
        ops = {"packed": packed, "group": parts.group_size, "perm": parts.perm, "n": n,
               "sz": sz.to(layer.params_dtype).contiguous()}
        layer.__dict__[_INT4] = ops
    return ops


def _int4_apply(kernels: QuantKernels) -> Any:
    def apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ops = _int4_operands(kernels, layer)
        x2 = x.reshape(-1, x.shape[-1])
        if ops["perm"] is not None:
            x2 = x2.index_select(1, ops["perm"])
        sz = ops["sz"]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.to(sz.dtype).contiguous(),
                                                       ops["packed"], ops["group"], sz)
        y = y[:, :ops["n"]]
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.to(x.dtype).reshape(*x.shape[:-1], -1)
    return apply


def _release(key: str) -> Any:
    def release(layer: nn.Module) -> None:
        layer.__dict__.pop(key, None)
    return release


def _int8_bytes(layer: nn.Module) -> int:
    return sum(layer.output_sizes) * layer.input_size


def _int4_bytes(layer: nn.Module) -> int:
    n, k = sum(layer.output_sizes), layer.input_size
    return n * k // 2 + 4 * n * (k // layer.quant_weight.group_size)


def quant_candidates(method: QuantLinearMethod, layer: nn.Module) -> list[LinearCandidate]:
    """The incumbent, then every torch implementation that runs ``layer``."""
    kernels = method.kernels
    version = torch.__version__
    out = [incumbent(method)]
    if _w8a8(layer):
        out.append(LinearCandidate(
            "torch-int8", f"{version}-{torch.backends.cpu.get_cpu_capability()}",
            _int8_apply(kernels), _w8a8, prepare=lambda m: _int8_operands(kernels, m) and None,
            release=_release(_INT8), copy_bytes=_int8_bytes))
    if _int4_ok(layer):
        out.append(LinearCandidate(
            "torch-int4", f"{version}-{torch.backends.cpu.get_cpu_capability()}",
            _int4_apply(kernels), _int4_ok, prepare=lambda m: _int4_operands(kernels, m) and None,
            release=_release(_INT4), copy_bytes=_int4_bytes))
    return out
