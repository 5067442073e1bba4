"""The x86 unquantized linear method: weight-streaming GEMV for decode, blocked GEMM above.

Which kernel runs depends on the number of token rows ``M`` (thresholds measured
on the llama-1b shapes, docs/performance.md):

- ``M <= gemv_max_m``: the compiled weight-streaming GEMV reads each weight byte
  once per step, converting bf16/fp16 to fp32 in registers; decode is bound by
  memory bandwidth, and this streams at close to the machine's read bandwidth.
- larger ``M``: the compiled blocked GEMM (``gemm.cpp``), compute bound; it
  converts weights in registers too, so bf16 weights run at the fp32 FMA rate.
  On CPUs without native bf16, torch's bf16 GEMM is several times slower, and
  on the fp32 shapes measured here the blocked GEMM also beats torch's.

Weights keep core's layout and dtype (``[out, in]``), so loading, tensor
parallelism and the reference fallback are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from glowlm.plugin_api import (
    TORCH_LINEAR,
    LinearCandidate,
    UnquantizedLinearMethod,
    core_env,
    mapped_zeros,
    onednn_candidates,
)
from torch import nn

from glowlm_x86.kernels import ops

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class GemmPolicy:
    """The largest token-row count that still runs the GEMV (see the module docstring)."""

    gemv_max_m: int = 8


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 policy: GemmPolicy = GemmPolicy()) -> torch.Tensor:
    """``F.linear`` with the kernel choice above, on a plain ``[out, in]`` weight.

    The OpsTable's ``dense_linear`` (the LM head, tied to the embedding) and
    :class:`X86LinearMethod` share it.
    """
    if weight.dtype not in KERNEL_DTYPES:
        return F.linear(x, weight, bias)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] <= policy.gemv_max_m:
        y = ops.gemv(x2, weight, bias)
    else:
        y = ops.gemm(x2, weight, bias)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def _kernel_weight(layer: nn.Module) -> bool:
    w = getattr(layer, "weight", None)
    return isinstance(w, torch.Tensor) and w.dim() == 2 and w.dtype in KERNEL_DTYPES


def glowlm_candidate(policy: GemmPolicy, kernel_version: str) -> LinearCandidate:
    """glowlm's GEMV/GEMM as a measured-choice candidate (``GLOWLM_LINEAR_IMPL=glowlm``).

    ``fused=True``: the fused decoder layer and stack ops run this very kernel, so they
    stay on for the token classes where it wins every linear they cover. The version
    is the compiled module's name (ISA and C++ source hash), so a kernel change
    measures again.
    """
    return LinearCandidate(
        "glowlm", f"{kernel_version}-m{policy.gemv_max_m}",
        lambda layer, x, bias: dense_linear(x, layer.weight, bias, policy),
        _kernel_weight, fused=True)


def _packed_supports(layer: nn.Module) -> bool:
    w = getattr(layer, "weight", None)
    if not (isinstance(w, torch.Tensor) and w.dim() == 2 and w.layout == torch.strided):
        return False
    if w.dtype == torch.bfloat16:
        return w.shape[1] % 2 == 0 and ops.packed_width(w.dtype) > 0
    return w.dtype == torch.float32


def packed_weight(layer: nn.Module) -> torch.Tensor:
    """``layer``'s weight in the block-packed layout (``ops.pack_blocks``), made on first
    use and kept beside the plain weight (which the fused ops, tied embeddings and the
    other candidates read). In its own mapping in huge pages, as the model's weights are:
    in malloc's 4 KiB pages the bf16 kernel streamed one token row ~25 % slower (TLB
    misses), and the measured choice then never picked it. Packed straight into that
    mapping: a fresh tensor and a second copy added 20-130 ms per 16384 x 2048 layer on a
    Zen 4 guest (its page faults, the copy, huge-page allocation), and every measured
    layer pays the packing."""
    packed = layer.__dict__.get("packed_weight")
    if packed is None:
        w = layer.weight.detach()
        packed = mapped_zeros(ops.packed_shape(w), w.dtype, huge=not core_env().no_huge_pages)
        ops.pack_blocks_into(w, packed)
        layer.__dict__["packed_weight"] = packed
    return packed


def _packed_apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
                  ) -> torch.Tensor:
    w = layer.weight
    x2 = x.reshape(-1, x.shape[-1])
    if x2.dtype != w.dtype:  # the model's dtype is the weights' wherever this is offered
        return F.linear(x, w, bias)
    y = ops.gemm_packed(x2, packed_weight(layer), w.shape[0], bias)
    return y.reshape(*x.shape[:-1], w.shape[0])


def _packed_release(layer: nn.Module) -> None:
    layer.__dict__.pop("packed_weight", None)


def _packed_copy_bytes(layer: nn.Module) -> int:
    w = layer.weight
    width = ops.packed_width(w.dtype)
    return -(-w.shape[0] // width) * width * w.shape[1] * w.element_size()


def packed_candidate(kernel_version: str) -> LinearCandidate:
    """The block-packed GEMM (``cpu/gemm_packed.h``) as a candidate: fp32 weights on every
    build, bf16 weights on builds with the pairwise bf16 dot product (AVX512_BF16).
    Between one row and oneDNN's batches, at 2-16 token rows (a server's concurrent
    decodes), it pays about the larger of the weight read and the multiply-adds where the
    row-major GEMV and oneDNN pay more (docs/performance.md). Keeps its own copy of each
    weight it runs."""
    return LinearCandidate(
        "glowlm-packed", f"{kernel_version}-huge", _packed_apply, _packed_supports,
        release=_packed_release, prepare=packed_weight, copy_bytes=_packed_copy_bytes)


def packed_available() -> bool:
    """Whether the loaded kernel build has the block-packed GEMM (for float32 at least)."""
    try:
        return ops.packed_width(torch.float32) > 0
    except (AttributeError, RuntimeError):  # a module built before the op existed
        return False


class X86LinearMethod(UnquantizedLinearMethod):
    """Dense weights; compiled GEMV for small M, compiled blocked GEMM above.

    Offers the measured choice glowlm's kernels first (the default), the block-packed
    GEMM (fp32; bf16 where the build has a bf16 dot product), then oneDNN on a packed
    weight and
    torch's ``F.linear`` (native bf16 / AMX where the CPU has them).
    """

    #: The platform's fused ops run this method's kernels (glowlm_x86.platform.ops).
    runs_fused_kernels = True

    def __init__(self, policy: GemmPolicy | None = None, kernel_version: str = "unknown"
                 ) -> None:
        self.policy = policy or GemmPolicy()
        self.kernel_version = kernel_version

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor:
        return dense_linear(x, layer.weight, bias, self.policy)

    def linear_candidates(self, layer: nn.Module) -> list[LinearCandidate]:
        packed = [packed_candidate(self.kernel_version)] if packed_available() else []
        return [glowlm_candidate(self.policy, self.kernel_version), *packed,
                *onednn_candidates(), TORCH_LINEAR]
