"""The compiled op against glowlm's reference, and torch.library's own checks of it.

Tolerances: float32 differs from the reference by summation order only (1e-5);
bfloat16/float16 by one unit in the last place of the output (the op and the
reference round at the same points).
"""

from __future__ import annotations

import pytest
import torch
from glowlm.plugin_api import reference_ops
from glowlm_example import ops

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5),
       torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}


def _randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("shape", [(1, 64), (7, 2048), (3, 5, 100), (2, 13)])
@pytest.mark.parametrize("weight_fp32", [False, True])
def test_rms_norm_matches_the_reference(dtype: torch.dtype, shape: tuple[int, ...],
                                        weight_fp32: bool) -> None:
    x = _randn(*shape, dtype=dtype)
    w = _randn(shape[-1], dtype=torch.float32 if weight_fp32 else dtype, seed=1)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), reference_ops.rms_norm(x, w, 1e-6),
                               **TOL[dtype])


def test_non_contiguous_input() -> None:
    x = _randn(8, 128, dtype=torch.float32)[:, :64]
    w = _randn(64, dtype=torch.float32, seed=1)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), reference_ops.rms_norm(x, w, 1e-6))


def test_a_wrong_weight_is_a_named_error() -> None:
    with pytest.raises(RuntimeError, match=r"rms_norm: weight must be \[64\]"):
        ops.rms_norm(torch.randn(2, 64), torch.randn(63), 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(dtype: torch.dtype) -> None:
    # Schema, fake (meta) kernel, autograd registration and dispatcher checks.
    x, w = _randn(5, 96, dtype=dtype), _randn(96, dtype=dtype, seed=1)
    torch.library.opcheck(torch.ops.glowlm_example.rms_norm.default, (x, w, 1e-6))


def test_fake_kernel_gives_shape_and_dtype_without_running() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = ops.rms_norm(torch.empty(3, 7, 64, dtype=torch.bfloat16),
                           torch.empty(64, dtype=torch.bfloat16), 1e-6)
    assert out.shape == (3, 7, 64) and out.dtype == torch.bfloat16
