"""The weight-streaming GEMV, the blocked GEMM and the x86 linear method.

The reference is the fp32 product of the same (already rounded) inputs. fp32
results differ from it only by summation order (1e-4 relative on K up to 2048);
bf16/fp16 outputs are rounded once to the output dtype (one ulp: 1.6e-2 / 2e-3).

bf16 activations with bf16 weights run the pairwise bf16 dot product on AVX512_BF16
(vdpbf16ps, ``gemv_bf16`` in csrc/cpu/gemv.h). Every product of two bf16 is exact in
fp32, so the result is the fp32 path's up to the order of the fp32 additions; those
tests hold it to that bound rather than the ulp tolerances above (``_bf16_bound``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from glowlm.plugin_api import reference_ops as reference
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


def _bf16_bound(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                want: torch.Tensor) -> torch.Tensor:
    """How far a bf16 GEMV output may be from the exact fp32 product ``want``.

    The kernel sums exact products in fp32 in some order (any order: at most K + 1
    roundings reach each term, the bias included), |error| <= (K + 1) u sum|x w| + |b| u
    with u = 2^-24; 2^-22 leaves room for Arm's BFDOT, which rounds twice per pair (to
    odd, one ulp each). Then the output is rounded once to bf16: 2^-8 relative.
    """
    k = x.shape[1]
    mag = x.float().abs() @ w.float().abs().T + (0 if b is None else b.float().abs())
    return 2.0 ** -8 * want.abs() + 1.01 * (k + 1) * 2.0 ** -22 * mag


@pytest.mark.parametrize("m", range(1, 9))
@pytest.mark.parametrize("n,k", [(1, 1), (3, 2), (5, 31), (7, 33), (9, 63), (70, 100),
                                 (130, 1000), (64, 2048), (70, 2047), (129, 2049),
                                 (257, 4099)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_bf16_activations_and_weights(m: int, n: int, k: int, bias: bool) -> None:
    """bf16 x and w (the engine's bf16 decode): odd K, K not a multiple of 32 (one
    vdpbf16ps step) with a scalar tail, short rows (< 4 KiB, two streams per chunk) and
    long ones (four), row counts that leave partial chunks and leftover rows, and every
    M of decode (the token tile of 4, its remainder)."""
    x, w, b, _ = _case(m, n, k, torch.bfloat16, bias, seed=k + m)
    want = reference.dense_linear(x.float(), w.float(), None if b is None else b.float())
    got = ops.gemv(x, w, b)
    assert got.dtype == torch.bfloat16
    err = (got.float() - want).abs()
    bound = _bf16_bound(x, w, b, want)
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3g}"


@pytest.mark.parametrize("m", [1, 4, 8])
def test_gemv_bf16_path_differs_from_fp32_path_by_order_only(m: int) -> None:
    """bf16 x against the same x in fp32 (the convert-then-FMA path, same exact
    products): the two fp32 sums differ by rounding order only, the bf16 output by its
    one rounding."""
    x, w, b, _ = _case(m, 300, 2048, torch.bfloat16, True, seed=5)
    fp32_path = ops.gemv(x.float(), w, b)  # fp32 activations: x converted, not bf16 pairs
    got = ops.gemv(x, w, b)
    bound = 2 * _bf16_bound(x, w, b, fp32_path)
    assert ((got.float() - fp32_path).abs() <= bound).all()


def test_gemv_bf16_runs_the_pairwise_dot_product_exactly_on_avx512_bf16() -> None:
    """Which inner loop ran, seen in its summation order: x[0] + x[1] = 2^25 + 1 rounds
    to 2^25 in fp32 when k = 0, 1 share a dot2 lane (the bf16 path), while the fp32 path
    adds x[0] and x[16] = -2^25 in one lane first. Both are within the bound above."""
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1], x[0, 16] = 2.0 ** 25, 1.0, -2.0 ** 25
    w = torch.ones(1, 32, dtype=torch.bfloat16)
    assert ops.gemv(x, w).item() == 1.0  # fp32 activations: the fp32 path everywhere
    pairwise = require_kernels().isa == "avx512-bf16"
    assert ops.gemv(x.bfloat16(), w).item() == (0.0 if pairwise else 1.0)


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
