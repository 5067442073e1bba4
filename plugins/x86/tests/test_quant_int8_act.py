"""Weight-only layers with int8 activations (``wna8_linear``) against core's reference.

GGUF's own implementation multiplies its quantized blocks by activations quantized to
int8 per block of 32 columns; ``WeightOnlyInt.act_block = 32`` asks for that, and the
x86 modules without a bf16 dot product (avx2, avx512) run it with ``vpmaddubsw``. The
reference (:data:`REFERENCE_KERNELS`) quantizes the activations with the same rule and
runs the dequantized weights in float32, so the integers agree exactly and the results
differ only by the order of float32 additions: the tolerance is 2e-5 of max|y| in
float32 (the products are integers times two scales; K <= 2048 adds), one bf16 rounding
for bf16 outputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from glowlm.plugin_api import REFERENCE_QUANT_KERNELS as REFERENCE_KERNELS
from glowlm.plugin_api import WeightOnlyInt
from glowlm_x86.kernels.testing import require_kernels


@pytest.fixture(scope="module")
def kernels():
    # The module for the live CPU, whatever platform an earlier test left chosen.
    from glowlm_x86.quant import kernels_for_isa, load_quant_ops

    isa = require_kernels().isa
    if not load_quant_ops(isa):
        pytest.fail("the quantized kernels (quant_*.cpp) did not build or load")
    return kernels_for_isa(isa)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))


def _weights(bits: int, n: int, k: int, group: int, symmetric: bool, seed: int,
             half: bool = False) -> WeightOnlyInt:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.uint8)
    scales = torch.rand(n, k // group, generator=g) * 0.02 + 1e-3
    if half:
        scales = scales.half().float()
    mid = float(1 << (bits - 1))
    zeros = (torch.full((n, k // group), mid) if symmetric
             else torch.rand(n, k // group, generator=g) * (1 << bits))  # float zeros (Q4_1)
    return WeightOnlyInt(q, scales, zeros, bits, group, act_block=32)


@pytest.mark.parametrize("m", (1, 2, 3, 4, 5, 9, 12, 70))
@pytest.mark.parametrize("bits, n, k, group", [(4, 40, 64, 32), (4, 64, 256, 128),
                                               (4, 48, 96, 16), (8, 48, 128, 32),
                                               (8, 32, 64, 16), (8, 40, 256, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_activations_match_reference(kernels, m: int, bits: int, n: int, k: int,
                                          group: int, dtype: torch.dtype) -> None:
    w = _weights(bits, n, k, group, symmetric=(m % 2 == 0), seed=m * 1000 + n + k + bits)
    g = torch.Generator().manual_seed(m + k)
    x = torch.randn(m, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    want = REFERENCE_KERNELS.weight_only(x, w, bias)
    p = kernels.prepare_weight_only(w)
    assert p.act_block == 32
    got = kernels.weight_only(x, p, bias)
    assert got.dtype == dtype and got.shape == (m, n)
    assert _rel_err(got, want) < (2e-5 if dtype == torch.float32 else 8e-3)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n", [16, 48, 256, 600, 1040])
@pytest.mark.parametrize("half", [True, False])
def test_int8_activations_decode_split_and_fp16_scales(kernels, bits: int, n: int,
                                                       half: bool) -> None:
    """Decode (1-3 rows) splits the blocks into two far-apart streams walked in runs of
    adjacent blocks, an odd block alone (n = 16: no stream, 48: one pair and a tail, 1040:
    65 blocks, runs of 4 and a tail); prefill one block per item: every row lands where
    the reference puts it; fp16 scales (GGUF's) are read as such."""
    w = _weights(bits, n, 576, 32, symmetric=False, seed=bits + n, half=half)
    p = kernels.prepare_weight_only(w)
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(n))
    for m in (1, 2, 3, 4):
        want = REFERENCE_KERNELS.weight_only(x[:m], w, None)
        assert _rel_err(kernels.weight_only(x[:m], p, None), want) < 2e-5


@pytest.mark.parametrize("bits, group", [(4, 16), (4, 32), (4, 128), (8, 16), (8, 32)])
def test_int8_activations_extreme_sums_are_exact(kernels, bits: int, group: int) -> None:
    """The largest integer sums: every 4-bit value 15 (16 columns of 15 * 127 fill int16
    to 30 480) and every 8-bit value 0 (q - 128 = -128: a vpmaddubsw pair is
    2 * 128 * 127 = 32 512), against activations all +max or all -max. Any saturation
    would show as a wrong sum; the reference's sums of these integers are exact."""
    n, k = 32, 256
    q = torch.full((n, k), 15 if bits == 4 else 0, dtype=torch.uint8)
    scales = torch.ones(n, k // group)
    zeros = torch.full((n, k // group), float(1 << (bits - 1)))
    w = WeightOnlyInt(q, scales, zeros, bits, group, act_block=32)
    p = kernels.prepare_weight_only(w)
    for sign in (1.0, -1.0):
        for rows in (2, 8):  # decode's tiles; prefill's (the 8-row VNNI tile there)
            x = torch.full((rows, k), sign)
            want = REFERENCE_KERNELS.weight_only(x, w, None)
            assert torch.equal(kernels.weight_only(x, p, None), want)


def test_tiny_activation_blocks_are_zeros(kernels) -> None:
    """A block whose max|x| is below 1e-30 (127 / max|x| would overflow float32) is all
    zeros, in the kernel and the reference alike; its neighbours are unaffected."""
    w = _weights(4, 32, 128, 32, symmetric=False, seed=4)
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(4))
    x[0, :32] = 1e-38
    x[0, 40] = 0.0
    x[1, 32:64] = 0.0
    p = kernels.prepare_weight_only(w)
    want = REFERENCE_KERNELS.weight_only(x, w, None)
    assert _rel_err(kernels.weight_only(x, p, None), want) < 2e-5
    assert torch.isfinite(want).all()


def test_8bit_weights_must_be_the_signed_layout(kernels) -> None:
    """wna8_linear reads 8-bit weights only as W8A8's int8 layout: wna16's uint8 column
    pairs are refused, not misread."""
    w = _weights(8, 16, 64, 32, symmetric=True, seed=2)
    p = kernels.prepare_weight_only(w)
    assert p.weight.dtype == torch.int8
    with pytest.raises(RuntimeError, match="int8"):
        torch.ops.glowlm_x86.wna8_linear(torch.randn(1, 64), p.weight.view(torch.uint8),
                                         p.scales, p.zs, 8, 32, 16, None)


def test_int8_activations_are_the_quantization_error_away(kernels) -> None:
    """Against the same weights with unquantized activations: the difference is the
    per-block int8 rounding (|x - x^| <= max|x| / 254 per block), far below the weights'
    own 4-bit error, and not zero (the path is really taken)."""
    w = _weights(4, 64, 512, 32, symmetric=False, seed=5)
    exact = WeightOnlyInt(w.q, w.scales, w.zeros, 4, 32)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(3))
    got = kernels.weight_only(x, kernels.prepare_weight_only(w), None)
    full = kernels.weight_only(x, kernels.prepare_weight_only(exact), None)
    err = _rel_err(got, full)
    assert 0 < err < 2e-2


def test_packed_rows_read_the_signed_8bit_layout(kernels) -> None:
    """A tied embedding reads its rows from the LM head's packed weight: the 8-bit
    int8-activation layout ([N/16][K/4][16][4], q - 128) gives the canonical values."""
    w = _weights(8, 40, 64, 32, symmetric=False, seed=9)
    p = kernels.prepare_weight_only(w)
    rows = torch.tensor([0, 5, 17, 39])
    assert torch.allclose(kernels.weight_only_rows(p, rows),
                          REFERENCE_KERNELS.weight_only_rows(w, rows), rtol=0, atol=1e-6)


def test_int8_activations_refuse_unfit_layers(kernels) -> None:
    """K not whole blocks of 32, or act-order columns: a clear error at load."""
    w = _weights(4, 16, 48, 16, symmetric=True, seed=1)
    with pytest.raises(ValueError, match="blocks of 32"):
        kernels.prepare_weight_only(w)


def test_module_isa_decides_the_default(kernels) -> None:
    """avx2 / avx512 modules prefer int8 activations; avx512-bf16 keeps the bf16 dot
    (unless the host says otherwise, below)."""
    from glowlm_x86.quant import kernels_for_isa

    assert kernels_for_isa("avx2").int8_activations
    assert kernels_for_isa("avx512").int8_activations
    assert not kernels_for_isa("avx512-bf16").int8_activations
    assert not REFERENCE_KERNELS.int8_activations


def test_zen4_takes_int8_activations_by_default(tmp_path) -> None:
    """avx512-bf16 keeps the bf16 dot except on Zen 4 (CPUID family 25 with AVX-512),
    whose 512-bit dot products run at half rate; Zen 5 (family 26) and Intel keep it."""
    from glowlm.plugin_api import from_dump
    from glowlm.testing import hosts
    from glowlm_x86.quant import half_rate_avx512, int8_activations_auto

    root = hosts.__path__[0]
    zen4 = from_dump(f"{root}/x86_64-zen4-epyc-9r14.cpuinfo")
    icelake = from_dump(f"{root}/x86_64-icelake-xeon-8375c.cpuinfo")
    zen5_dump = tmp_path / "zen5.cpuinfo"
    text = Path(root, "x86_64-zen4-epyc-9r14.cpuinfo").read_text()
    zen5_dump.write_text(text.replace("cpu family\t: 25", "cpu family\t: 26"))
    zen5 = from_dump(zen5_dump)
    assert (zen4.cpu_family, zen5.cpu_family, icelake.cpu_family) == (25, 26, 6)
    assert half_rate_avx512(zen4)
    assert not half_rate_avx512(zen5) and not half_rate_avx512(icelake)
    assert int8_activations_auto("avx512-bf16", zen4)
    assert not int8_activations_auto("avx512-bf16", zen5)
    assert not int8_activations_auto("avx512-bf16", icelake)
    assert int8_activations_auto("avx2", zen5) and int8_activations_auto("avx512", icelake)
