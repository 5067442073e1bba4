"""The weight-streaming GEMV, the blocked GEMM and the x86 linear method.

The reference is the fp32 product of the same (already rounded) inputs. fp32
results differ from it only by summation order (1e-4 relative on K up to 2048);
bf16/fp16 outputs are rounded once to the output dtype (one ulp: 1.6e-2 / 2e-3).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from glowlm_x86.kernels import ops
from glowlm_x86.kernels.linear import GemmPolicy, X86LinearMethod
from glowlm_x86.kernels.testing import require_kernels
from torch import nn

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4),
       torch.bfloat16: dict(atol=2e-2, rtol=1.6e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}


@pytest.fixture(autouse=True)
def kernels() -> None:
    require_kernels()


def _case(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, seed: int = 0
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    want = F.linear(x.float(), w.float(), None if b is None else b.float()).to(dtype)
    return x, w, b, want


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m", [1, 2, 3, 5, 16, 33])
@pytest.mark.parametrize("n,k", [(1, 8), (3, 13), (4, 64), (7, 100), (130, 256), (300, 768),
                                 (64, 2048), (70, 2100)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv(dtype: torch.dtype, m: int, n: int, k: int, bias: bool) -> None:
    x, w, b, want = _case(m, n, k, dtype, bias)
    torch.testing.assert_close(ops.gemv(x, w, b), want, **TOL[dtype])


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m", [5, 6, 8, 20, 32, 33, 130, 530])
@pytest.mark.parametrize("n,k", [(1, 16), (3, 13), (7, 100), (50, 1030), (97, 2049), (130, 256)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm(dtype: torch.dtype, m: int, n: int, k: int, bias: bool) -> None:
    """Row counts around the register tile; token counts in one or two panels (the
    few-panel path), more, and past the 256-token work item; K around the 256-wide
    block and lane groups."""
    x, w, b, want = _case(m, n, k, dtype, bias)
    torch.testing.assert_close(ops.gemm(x, w, b), want, **TOL[dtype])


@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float16])
def test_gemm_mixed_dtypes_half_weight_fp32_activations(wdtype: torch.dtype) -> None:
    x, w, _, _ = _case(9, 20, 70, torch.float32, False)
    w = w.to(wdtype)
    torch.testing.assert_close(ops.gemm(x, w), F.linear(x, w.float()), **TOL[torch.float32])


def test_gemm_empty_k_gives_bias() -> None:
    b = torch.randn(4)
    got = ops.gemm(torch.randn(6, 0), torch.randn(4, 0), b)
    torch.testing.assert_close(got, b.expand(6, 4))


def test_gemv_mixed_dtypes_bf16_weight_fp32_activations() -> None:
    x, w, _, _ = _case(3, 20, 64, torch.float32, False)
    w = w.to(torch.bfloat16)
    torch.testing.assert_close(ops.gemv(x, w), F.linear(x, w.float()), **TOL[torch.float32])


def test_shape_errors_are_named() -> None:
    with pytest.raises(RuntimeError, match=r"gemv: x must be \[M, K\]"):
        ops.gemv(torch.randn(2, 8), torch.randn(4, 9))
    with pytest.raises(RuntimeError, match=r"gemm: x must be \[M, K\]"):
        ops.gemm(torch.randn(2, 8), torch.randn(4, 9))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 4, 17, 64])
def test_linear_method_matches_torch_on_every_path(dtype: torch.dtype, m: int) -> None:
    x, w, b, want = _case(m, 48, 64, dtype, True)
    layer = nn.Module()
    method = X86LinearMethod(GemmPolicy(gemv_max_m=4))
    method.create_weights(layer, 64, [16, 32], dtype)
    layer.weight.data.copy_(w)
    torch.testing.assert_close(method.apply(layer, x, b), want, **TOL[dtype])
    # 3-d input keeps its leading dims
    got3 = method.apply(layer, x.unsqueeze(0), b)
    assert got3.shape == (1, m, 48)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(dtype: torch.dtype) -> None:
    x, w, b, _ = _case(3, 12, 32, dtype, True)
    torch.library.opcheck(torch.ops.glowlm_x86.gemv.default, (x, w, b))
    torch.library.opcheck(torch.ops.glowlm_x86.gemv.default, (x, w, None))
    torch.library.opcheck(torch.ops.glowlm_x86.gemm.default, (x, w, b))
    torch.library.opcheck(torch.ops.glowlm_x86.gemm.default, (x, w, None))
