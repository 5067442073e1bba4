"""The quantized layers' linear-choice candidates on the compiled kernels.

The kernels' layouts read back exactly (what the candidates start from), the compiled
activation quantization gives core's integers, each torch candidate computes the
layer's arithmetic (``torch-int8``: the same int32 sums as the kernels; ``torch-int4``:
the checkpoint's W4A16), and the llm-compressor checkpoints run end to end with each
candidate pinned and with the measured choice.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from glowlm.layers.quantization.candidates import quant_candidates
from glowlm.layers.quantization.kernels import quantize_activations
from glowlm.layers.quantization.method import QuantLinearMethod
from glowlm.plugin_api import REFERENCE_QUANT_KERNELS as REFERENCE_KERNELS
from glowlm.plugin_api import Int8Weights, WeightOnlyInt
from glowlm_kernels.quant import unpack_w8a8, unpack_weight_only
from torch import nn

FIXTURES = Path(__file__).resolve().parents[3] / "core" / "tests" / "fixtures" / "quant"


@pytest.fixture(scope="module")
def kernels():
    from glowlm.testing import current_platform
    from glowlm_x86.kernels.testing import require_kernels
    from glowlm_x86.platform import X86Platform
    from glowlm_x86.quant import kernels_for_isa, load_quant_ops

    require_kernels()
    platform = current_platform()
    if not isinstance(platform, X86Platform) or platform.kernels() is None:
        pytest.skip("the x86 kernels do not run on this host")
    isa = platform.kernels().isa
    assert load_quant_ops(isa), "the quantized kernels (quant_*.cpp) did not build or load"
    return kernels_for_isa(isa)


def _weight_only(n: int, k: int, bits: int, group: int, symmetric: bool, seed: int
                 ) -> WeightOnlyInt:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.uint8)
    scales = torch.rand(n, k // group, generator=g) * 0.02 + 1e-3
    zeros = (torch.full((n, k // group), float(1 << (bits - 1))) if symmetric
             else torch.randint(0, 1 << bits, (n, k // group), generator=g).float())
    return WeightOnlyInt(q, scales, zeros, bits, group)


@pytest.mark.parametrize("bits, act_block", [(4, 0), (4, 32), (8, 0), (8, 32)])
@pytest.mark.parametrize("symmetric", [True, False])
def test_weight_only_layout_reads_back(kernels, bits: int, act_block: int,
                                       symmetric: bool) -> None:
    w = _weight_only(40, 128, bits, 32, symmetric, bits + act_block)
    w.act_block = act_block
    parts = unpack_weight_only(kernels.prepare_weight_only(w))
    assert torch.equal(parts.q, w.q)
    assert torch.equal(parts.scales, w.scales)
    torch.testing.assert_close(parts.zs, w.zeros * w.scales, rtol=0, atol=0)
    assert parts.bits == bits and parts.group_size == 32


@pytest.mark.parametrize("k", [64, 66])
def test_w8a8_layout_reads_back(kernels, k: int) -> None:
    g = torch.Generator().manual_seed(k)
    w = Int8Weights(torch.randint(-127, 128, (40, k), generator=g, dtype=torch.int8),
                    torch.rand(40, generator=g), 0.02, 3)
    back = unpack_w8a8(kernels.prepare_w8a8(w), k)
    assert torch.equal(back.q, w.q) and torch.equal(back.weight_scale, w.weight_scale)
    assert (back.input_scale, back.input_zero_point) == (0.02, 3)


@pytest.mark.parametrize("static", [None, (0.02, 0), (0.03, 5)])
def test_compiled_activation_quantization_is_cores(kernels, static) -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(70, 96, generator=g) * 3
    x[5] = 0  # an all-zero row: scale 1, zeros
    scale, zp = static if static else (None, 0)
    w = Int8Weights(torch.ones(16, 96, dtype=torch.int8), torch.ones(16), scale, zp)
    q, s = kernels.int8_activations_of(x, kernels.prepare_w8a8(w))
    want_q, want_s = quantize_activations(x, scale, zp)
    assert q.dtype == torch.int8 and torch.equal(q.float(), want_q)
    assert torch.equal(s, want_s)


class _Layer(nn.Module):
    """What a quantized linear layer carries after loading (LinearBase + the method)."""

    def __init__(self, n: int, k: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_size, self.output_sizes, self.params_dtype = k, [n], dtype


class _Method(QuantLinearMethod):
    """A format's method once its weights are prepared (its create_weights is unused)."""

    def create_weights(self, *args: object) -> None:
        raise AssertionError("not loading")


def _candidates(kernels, layer: _Layer) -> dict:
    return {c.name: c for c in quant_candidates(_Method(kernels), layer)}


@pytest.mark.parametrize("static", [None, (0.03, 5)])
@pytest.mark.parametrize("m", [1, 5, 40])
def test_torch_int8_sums_what_the_kernels_sum(kernels, static, m: int) -> None:
    g = torch.Generator().manual_seed(m)
    n, k = 48, 130
    scale, zp = static if static else (None, 0)
    w = Int8Weights(torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8),
                    torch.rand(n, generator=g) * 0.01, scale, zp)
    layer = _Layer(n, k, torch.float32)
    layer.quant_w8a8, layer.quant_weight = True, kernels.prepare_w8a8(w)
    cands = _candidates(kernels, layer)
    assert list(cands) == ["glowlm-quant", "torch-int8"]
    x = torch.randn(m, k, generator=g)
    bias = torch.randn(n, generator=g)
    want = cands["glowlm-quant"].apply(layer, x, bias)
    got = cands["torch-int8"].apply(layer, x, bias)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    cands["torch-int8"].release(layer)
    assert "torch_int8_weight" not in layer.__dict__


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("perm", [False, True])
def test_torch_int4_computes_w4a16(kernels, symmetric: bool, perm: bool) -> None:
    n, k = 40, 256  # not whole blocks of 16 rows: torch's packing pads them
    w = _weight_only(n, k, 4, 64, symmetric, 11)
    if perm:  # act order: the kernels' columns sorted by group
        w.perm = torch.randperm(k, generator=torch.Generator().manual_seed(2))
    layer = _Layer(n, k, torch.bfloat16)
    layer.quant_w8a8, layer.quant_weight = False, kernels.prepare_weight_only(w)
    cands = _candidates(kernels, layer)
    assert list(cands) == ["glowlm-quant", "torch-int4"]
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(3)).bfloat16()
    got = cands["torch-int4"].apply(layer, x, None)
    want = REFERENCE_KERNELS.weight_only(x.float(), w, None)  # the checkpoint's W4A16
    assert got.dtype == torch.bfloat16
    # bf16 outputs and scales rounded to bf16 (2**-9 relative): well under 1 %.
    err = float((got.float() - want).norm() / want.norm())
    assert err < 1e-2, err


def test_torch_int4_only_where_it_runs(kernels) -> None:
    for dtype, bits, group, offered in [(torch.float32, 4, 64, False),
                                        (torch.bfloat16, 8, 64, False),
                                        (torch.bfloat16, 4, 16, False),
                                        (torch.float16, 4, 128, True)]:
        layer = _Layer(32, 256, dtype)
        w = _weight_only(32, 256, bits, group, True, 1)
        layer.quant_w8a8, layer.quant_weight = False, kernels.prepare_weight_only(w)
        assert ("torch-int4" in _candidates(kernels, layer)) is offered, (dtype, bits, group)


def _run(name: str, dtype: str, impl: str | None, cache: Path,
         monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    from glowlm import LLM, SamplingParams

    monkeypatch.setenv("GLOWLM_LINEAR_CHOICE_CACHE", str(cache))
    if impl is None:
        monkeypatch.delenv("GLOWLM_LINEAR_IMPL", raising=False)
    else:
        monkeypatch.setenv("GLOWLM_LINEAR_IMPL", impl)
    ref = json.loads((FIXTURES / name / "reference.json").read_text())
    llm = LLM(model=str(FIXTURES / name), dtype=dtype, max_model_len=64, show_progress=False)
    lps, greedy = [], []
    for prompt in ref["prompts"]:
        o = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(
            max_tokens=8, temperature=0, prompt_logprobs=0, ignore_eos=True),
            use_tqdm=False)[0]
        lps.append([next(iter(p.values())).logprob for p in o.prompt_logprobs[1:]])
        greedy.append(list(o.outputs[0].token_ids))
    return lps, greedy


def _max_diff(a: list, b: list) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True)
               for x, y in zip(ra, rb, strict=True))


@pytest.mark.parametrize("name, dtype, impl, tol", [
    # The same int32 sums: only the fp32 epilogue's rounding differs.
    ("w8a8-dynamic", "float32", "torch-int8", 1e-4),
    ("w8a8-static-tensor", "float32", "torch-int8", 1e-4),
    # W4A16 in bf16 against the kernels' path in bf16 (int8 activations where that is
    # their fast path): two bf16 runs of one checkpoint (docs/quantization.md's 0.1).
    ("gptq-w4a16-g32-sym", "bfloat16", "torch-int4", 0.1),
])
def test_checkpoints_run_on_each_candidate(kernels, name: str, dtype: str, impl: str,
                                           tol: float, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from glowlm.layers import linear_choice

    if impl == "torch-int8":
        # torch's int8 GEMM sums per-token int8 activations; where the kernels' fast path
        # runs dynamic W8A8 as 32-column blocks (AVX2 hosts) the layer is no longer W8A8
        # and torch-int8 is rightly not offered, so keep per-token scales for this case.
        monkeypatch.setenv("GLOWLM_WEIGHT_ONLY_INT8_ACTIVATIONS", "0")
    base_lps, base_greedy = _run(name, dtype, "glowlm-quant", tmp_path, monkeypatch)
    # The fused stack runs the same kernels on the same weights: kept in every class.
    assert linear_choice.LAST_PLAN.fused_classes.get("stack") == [
        "decode", "small", "batch", "prefill"]
    lps, greedy = _run(name, dtype, impl, tmp_path, monkeypatch)
    plan = linear_choice.LAST_PLAN
    assert plan.fused_classes.get("stack") == []  # it cannot call torch's GEMMs
    assert plan is not None and plan.mode == "pinned"
    quant = [k for k in plan.shapes if "glowlm-quant" in k]
    assert quant and all(plan.shapes[k]["prefill"].winner == impl for k in quant)
    assert _max_diff(lps, base_lps) < tol
    if tol < 1e-3:
        assert greedy == base_greedy
    _, measured = _run(name, dtype, None, tmp_path, monkeypatch)
    plan = linear_choice.LAST_PLAN
    assert plan.mode == "measured"
    for k in quant:  # every class timed on both
        for m in plan.shapes[k].values():
            assert m.us.get("glowlm-quant") and m.us.get(impl), (k, m)
