"""Norm, activation and rotary kernels against core's reference (glowlm.ops.reference).

Tolerances: float32 results differ from the reference only by summation order
(1e-5); bfloat16/float16 results may differ by one unit in the last place of
the output dtype, because the kernels round once where PyTorch sometimes
rounds twice (bf16 ulp at 1.0 is 7.8e-3, fp16's 9.8e-4).
"""

from __future__ import annotations

import pytest
import torch
from glowlm.plugin_api import reference_ops as reference
from glowlm_x86.kernels import ops
from glowlm_x86.kernels.testing import require_kernels

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5),
       torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}
DTYPES = list(TOL)


@pytest.fixture(autouse=True)
def kernels() -> None:
    require_kernels()


def _randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (7, 2048), (3, 5, 100), (2, 13)])
@pytest.mark.parametrize("weight_fp32", [False, True])
def test_rms_norm(dtype: torch.dtype, shape: tuple[int, ...], weight_fp32: bool) -> None:
    x = _randn(*shape, dtype=dtype)
    w = _randn(shape[-1], dtype=torch.float32 if weight_fp32 else dtype, seed=1)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6),
                               **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (5, 2048), (3, 100)])
def test_fused_add_rms_norm(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x, res = _randn(*shape, dtype=dtype), _randn(*shape, dtype=dtype, seed=2)
    w = _randn(shape[-1], dtype=dtype, seed=1)
    out, new_res = ops.fused_add_rms_norm(x, res, w, 1e-5)
    ref_out, ref_res = reference.fused_add_rms_norm(x, res, w, 1e-5)
    torch.testing.assert_close(new_res, ref_res, atol=0, rtol=0)  # one rounding, same place
    torch.testing.assert_close(out, ref_out, **TOL[dtype])


def test_rms_norm_reads_non_contiguous_input() -> None:
    x = _randn(8, 128, dtype=torch.float32)[:, :64]
    w = _randn(64, dtype=torch.float32, seed=1)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (7, 2048), (3, 5, 100), (2, 13), (1, 768)])
@pytest.mark.parametrize("weight_fp32", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(dtype: torch.dtype, shape: tuple[int, ...], weight_fp32: bool,
                    bias: bool) -> None:
    # Offset inputs: a two-pass variance stays accurate where E[x^2] - mean^2 would not.
    x = _randn(*shape, dtype=dtype) * 3 + 20
    wdt = torch.float32 if weight_fp32 else dtype
    w = _randn(shape[-1], dtype=wdt, seed=1)
    b = _randn(shape[-1], dtype=wdt, seed=2) if bias else None
    # torch's LayerNorm also computes in fp32 and rounds once: the two differ by the sum
    # order (fp32) or one output ulp (bf16/fp16).
    torch.testing.assert_close(ops.layer_norm(x, w, b, 1e-5),
                               reference.layer_norm(x, w, b, 1e-5).to(dtype), **TOL[dtype])


def test_layer_norm_equals_add_then_norm_in_the_fused_layer_order() -> None:
    # The decode layer adds the residual and normalises in one C++ call; the module path
    # adds with torch then calls this op. Both must see the same rounded sum.
    x, res = _randn(4, 768, dtype=torch.bfloat16), _randn(4, 768, dtype=torch.bfloat16, seed=5)
    w, b = _randn(768, dtype=torch.bfloat16, seed=1), _randn(768, dtype=torch.bfloat16, seed=2)
    torch.testing.assert_close(ops.layer_norm(x + res, w, b, 1e-5),
                               ops.layer_norm((x.float() + res.float()).to(torch.bfloat16), w,
                                              b, 1e-5), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu(dtype: torch.dtype) -> None:
    x = _randn(3, 1000, dtype=dtype)
    x[0, :3] = torch.tensor([float("nan"), -0.0, float("-inf")])
    torch.testing.assert_close(ops.relu(x), reference.relu(x), atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 128), (13, 2 * 37), (4, 2 * 8192), (2, 3, 2 * 40)])
def test_silu_and_mul(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = _randn(*shape, dtype=dtype) * 4
    torch.testing.assert_close(ops.silu_and_mul(x), reference.silu_and_mul(x), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("shape", [(5, 77), (2, 3, 1024), (1, 9000)])
def test_gelu(dtype: torch.dtype, name: str, shape: tuple[int, ...]) -> None:
    x = _randn(*shape, dtype=dtype) * 5
    torch.testing.assert_close(getattr(ops, name)(x), getattr(reference, name)(x),
                               **TOL[dtype])


def _cos_sin_cache(rotary_dim: int, max_pos: int = 512) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).float()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("head_size,rotary_dim", [(64, 64), (80, 80), (128, 128), (128, 64),
                                                  (96, 32), (40, 40)])
@pytest.mark.parametrize("tokens", [1, 7])
def test_rotary_embedding(dtype: torch.dtype, is_neox: bool, head_size: int, rotary_dim: int,
                          tokens: int) -> None:
    heads, kv_heads = 4, 2
    # q and k are views into one fused qkv row, as the attention layer makes them.
    qkv = _randn(tokens, (heads + 2 * kv_heads) * head_size, dtype=dtype)
    q = qkv[:, :heads * head_size].view(tokens, heads, head_size)
    k = qkv[:, heads * head_size:(heads + kv_heads) * head_size].view(tokens, kv_heads,
                                                                      head_size)
    positions = torch.randint(0, 512, (tokens,), generator=torch.Generator().manual_seed(3))
    cache = _cos_sin_cache(rotary_dim)
    got_q, got_k = ops.rotary_embedding(positions, q, k, cache, rotary_dim, is_neox)
    ref_q, ref_k = reference.rotary_embedding(positions, q, k, cache, rotary_dim, is_neox)
    torch.testing.assert_close(got_q, ref_q, **TOL[dtype])
    torch.testing.assert_close(got_k, ref_k, **TOL[dtype])


def test_rotary_rejects_positions_outside_the_cache() -> None:
    q = _randn(1, 2, 64, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="outside the cos/sin cache"):
        ops.rotary_embedding(torch.tensor([600]), q, q, _cos_sin_cache(64), 64, True)


def test_unsupported_dtype_is_named() -> None:
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        ops.silu_and_mul(torch.randn(2, 8, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(dtype: torch.dtype) -> None:
    x, res = _randn(3, 64, dtype=dtype), _randn(3, 64, dtype=dtype, seed=1)
    w = _randn(64, dtype=dtype, seed=2)
    q, k = _randn(3, 4, 64, dtype=dtype), _randn(3, 2, 64, dtype=dtype, seed=4)
    positions = torch.tensor([0, 5, 9])
    cases = [
        (torch.ops.glowlm_x86.rms_norm.default, (x, w, 1e-6)),
        (torch.ops.glowlm_x86.fused_add_rms_norm.default, (x, res, w, 1e-6)),
        (torch.ops.glowlm_x86.layer_norm.default, (x, w, res[0], 1e-5)),
        (torch.ops.glowlm_x86.layer_norm.default, (x, w, None, 1e-5)),
        (torch.ops.glowlm_x86.relu.default, (x,)),
        (torch.ops.glowlm_x86.rotary_embedding.default,
         (positions, q, k, _cos_sin_cache(64), 64, True)),
        (torch.ops.glowlm_x86.silu_and_mul.default, (x,)),
        (torch.ops.glowlm_x86.gelu.default, (x,)),
        (torch.ops.glowlm_x86.gelu_tanh.default, (x,)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)
