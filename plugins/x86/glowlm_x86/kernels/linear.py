"""The x86 unquantized linear method: weight-streaming GEMV for decode, fp32 GEMM for prefill.

Which kernel runs depends on the number of token rows ``M`` and the weight
dtype, with thresholds measured on the llama-1b shapes (docs/performance.md):

- ``M <= gemv_max_m``: the compiled weight-streaming GEMV reads each weight
  byte once per step and converts bf16/fp16 to fp32 in registers. On CPUs
  without native bf16, torch's bf16 GEMM is several times slower than this.
- larger ``M``, bf16/fp16 weights: ``gemm_converted`` converts blocks of weight
  rows to fp32 and runs torch's fp32 GEMM on them (compute bound, and the fp32
  GEMM is faster than torch's bf16 one here).
- larger ``M``, fp32 weights: torch's own GEMM (nothing to beat).

Weights keep core's layout and dtype (``[out, in]``), so loading, tensor
parallelism and the reference fallback are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from glowlm.layers.linear import UnquantizedLinearMethod
from torch import nn

from glowlm_x86.kernels import ops

HALF_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class GemmPolicy:
    """Row-count thresholds choosing the kernel (see the module docstring)."""

    half_gemv_max_m: int = 16
    fp32_gemv_max_m: int = 4
    convert_block_rows: int = 256
    #: fp32 GEMMs with more output rows run in blocks of this many: a 4096 x 2048 fp32
    #: block (32 MB) stays in a server's L3, and measured on Zen 3 (2 threads) the fused
    #: gate/up projection ran 20-30 % faster at M = 32 and M = 128 (docs/performance.md).
    fp32_block_rows: int = 4096


def _blocked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    rows: int) -> torch.Tensor:
    """``F.linear`` in blocks of ``rows`` output features, concatenated."""
    n = weight.shape[0]
    if n <= rows:
        return F.linear(x, weight, bias)
    parts = [F.linear(x, weight[i:i + rows], None if bias is None else bias[i:i + rows])
             for i in range(0, n, rows)]
    return torch.cat(parts, dim=-1)


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 policy: GemmPolicy = GemmPolicy()) -> torch.Tensor:
    """``F.linear`` with the kernel choice below, on a plain ``[out, in]`` weight.

    The OpsTable's ``dense_linear`` (the LM head, tied to the embedding) and
    :class:`X86LinearMethod` share it.
    """
    x2 = x.reshape(-1, x.shape[-1])
    m = x2.shape[0]
    if weight.dtype in HALF_DTYPES:
        if m <= policy.half_gemv_max_m:
            y = ops.gemv(x2, weight, bias)
        else:
            y = ops.gemm_converted(x2, weight, bias, policy.convert_block_rows)
    elif weight.dtype == torch.float32 and m <= policy.fp32_gemv_max_m:
        y = ops.gemv(x2, weight, bias)
    elif weight.dtype == torch.float32:
        y = _blocked_linear(x2, weight, bias, policy.fp32_block_rows)
    else:
        return F.linear(x, weight, bias)
    return y.reshape(*x.shape[:-1], weight.shape[0])


class X86LinearMethod(UnquantizedLinearMethod):
    """Dense weights; compiled GEMV for small M, converted fp32 GEMM for large M."""

    def __init__(self, policy: GemmPolicy | None = None) -> None:
        self.policy = policy or GemmPolicy()

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor:
        return dense_linear(x, layer.weight, bias, self.policy)
