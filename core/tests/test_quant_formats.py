"""Quantized checkpoint formats: parsing, unpacking, selection, and the reference path.

The checkpoints in ``fixtures/quant`` were written by llm-compressor (compressed-tensors)
and GPTQModel (the classic GPTQ layout), see ``tools/make_quant_checkpoints.py``, and each
carries ``reference.json``: what transformers computes in float32 from the tool's own
decompression (compressed-tensors; GPTQModel's ``dequantize_weight``). The end-to-end
test runs glowlm's *reference* kernels (pure PyTorch) in a subprocess with
``GLOWLM_DISABLE_KERNELS=1``; the compiled kernels have their own tests in the x86 plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from glowlm.errors import ModelLoadError
from glowlm.layers.quantization import resolve
from glowlm.layers.quantization.awq import AWQConfig, AWQLinearMethod
from glowlm.layers.quantization.compressed_tensors import CompressedTensorsConfig
from glowlm.layers.quantization.gptq import GPTQConfig, GPTQLinearMethod
from glowlm.layers.quantization.kernels import (
    REFERENCE_KERNELS,
    Int8Weights,
    WeightOnlyInt,
    int8_weights_as_blocks,
    quantize_activations,
)
from glowlm.layers.quantization.method import AWQ_ORDER, group_perm, unpack_int32
from torch import nn

FIXTURES = Path(__file__).parent / "fixtures" / "quant"
CHECKPOINTS = sorted(p.name for p in FIXTURES.iterdir() if (p / "reference.json").exists())
#: The reference path on one checkpoint per family (the x86 plugin's tests run all of
#: them on the compiled kernels, through the same core parsing).
REFERENCE_RUN = ["awq-w4a16-g32-asym", "gptq-w4a16-g32-asym-actorder",
                 "gptqmodel-w4-g32-asym-desc-act", "w8a16-channel", "w8a8-dynamic",
                 "w8a8-static-tensor"]
#: max |log p(glowlm) - log p(transformers)| per prompt token (docs/quantization.md).
WEIGHT_ONLY_TOL = 1e-4
DYNAMIC_W8A8_TOL = 0.1


def _pack(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """The inverse of unpack_int32 (sequential, lowest bits first)."""
    per = 32 // bits
    v = values.to(torch.int64)
    if dim == 0:
        v = v.view(v.shape[0] // per, per, v.shape[1])
        return sum(v[:, i] << (bits * i) for i in range(per)).to(torch.int32)
    v = v.view(v.shape[0], v.shape[1] // per, per)
    out = sum(v[..., i] << (bits * i) for i in range(per))
    return ((out + 2**31) % 2**32 - 2**31).to(torch.int32)


def test_unpack_int32_both_dims() -> None:
    g = torch.Generator().manual_seed(0)
    vals = torch.randint(0, 16, (16, 24), generator=g)
    assert torch.equal(unpack_int32(_pack(vals, 4, 0), 4, 0), vals)
    assert torch.equal(unpack_int32(_pack(vals, 4, 1), 4, 1), vals)
    vals8 = torch.randint(0, 256, (8, 12), generator=g)
    assert torch.equal(unpack_int32(_pack(vals8, 8, 1), 8, 1), vals8)


class _Layer(nn.Module):
    prefix = "model.layers.0.mlp.down_proj"
    output_sizes = [32]


def test_gptq_v1_and_awq_layouts_dequantize_to_the_same_weight() -> None:
    """One integer weight written in GPTQ v1 (zero - 1, input-dim packing) and in AWQ's
    interleaved output-dim packing gives the same canonical values."""
    g = torch.Generator().manual_seed(1)
    k, n, group = 64, 32, 32
    q = torch.randint(0, 16, (n, k), generator=g)
    zeros = torch.randint(1, 16, (n, k // group), generator=g)
    scales = torch.rand(k // group, n, generator=g).to(torch.float16)

    gptq = GPTQLinearMethod(GPTQConfig(4, group, False, False, False, False, [], {}),
                            REFERENCE_KERNELS)
    layer = _Layer()
    gptq.create_weights(layer, k, [n], torch.float16)
    layer.qweight.data.copy_(_pack(q.t(), 4, 0))
    layer.qzeros.data.copy_(_pack((zeros - 1).t(), 4, 1))
    layer.scales.data.copy_(scales)
    a = gptq.canonical(layer)

    order = torch.tensor(AWQ_ORDER)
    awq = AWQLinearMethod(AWQConfig(group, True, []), REFERENCE_KERNELS)
    layer2 = _Layer()
    awq.create_weights(layer2, k, [n], torch.float16)
    interleave = lambda t: t.reshape(t.shape[0], -1, 8).index_select(2, order).reshape(t.shape)  # noqa: E731
    layer2.qweight.data.copy_(_pack(interleave(q.t()), 4, 1))
    layer2.qzeros.data.copy_(_pack(interleave(zeros.t()), 4, 1))
    layer2.scales.data.copy_(scales)
    b = awq.canonical(layer2)
    assert torch.equal(a.q.long(), q) and torch.equal(b.q.long(), q)
    assert torch.equal(a.zeros, zeros.float()) and torch.equal(b.zeros, zeros.float())
    assert torch.equal(a.dequantize(), b.dequantize())


def test_act_order_g_idx_sorts_columns_into_groups() -> None:
    g_idx = torch.tensor([1, 0, 1, 0, 0, 1])
    perm = group_perm(g_idx, 3, "x")
    assert perm is not None and torch.equal(g_idx[perm], torch.tensor([0, 0, 0, 1, 1, 1]))
    assert group_perm(torch.tensor([0, 0, 1, 1]), 2, "x") is None
    with pytest.raises(ModelLoadError, match="every group"):
        group_perm(torch.tensor([0, 0, 0, 1]), 2, "x")


def test_reference_weight_only_with_perm_equals_dense() -> None:
    g = torch.Generator().manual_seed(2)
    q = torch.randint(0, 16, (8, 6), generator=g, dtype=torch.uint8)
    w = WeightOnlyInt(q, torch.rand(8, 2, generator=g), torch.full((8, 2), 8.0), 4, 3,
                      perm=torch.tensor([1, 3, 4, 0, 2, 5]))
    x = torch.randn(3, 6, generator=g)
    dense = torch.zeros(8, 6)
    dense[:, w.perm] = w.dequantize()
    torch.testing.assert_close(REFERENCE_KERNELS.weight_only(x, w, None), x @ dense.t())


def test_dynamic_activation_quantization_is_per_token_symmetric() -> None:
    x = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]])
    q, s = quantize_activations(x, None, 0)
    assert q.tolist() == [[64.0, -127.0, 32.0], [0.0, 0.0, 0.0]]
    assert s[0, 0] == pytest.approx(1 / 127) and s[1, 0] == 1.0
    w = Int8Weights(torch.tensor([[1, 2, 3]], dtype=torch.int8), torch.tensor([0.5]))
    y = REFERENCE_KERNELS.w8a8(x, w, None)
    assert y[0, 0] == pytest.approx((64 - 254 + 96) / 127 * 0.5)


def test_dynamic_w8a8_as_blocks_is_the_same_weight() -> None:
    ref = REFERENCE_KERNELS
    g = torch.Generator().manual_seed(3)
    w = Int8Weights(torch.randint(-127, 128, (48, 64), generator=g, dtype=torch.int8),
                    torch.rand(48, generator=g) * 1e-2)
    blocks = int8_weights_as_blocks(w)
    assert torch.equal(blocks.dequantize(), w.q.float() * w.weight_scale[:, None])
    x = torch.randn(3, 64, generator=g)
    # Per-32-column activation scales against per-token ones: both near the exact product.
    exact = x @ (w.q.float() * w.weight_scale[:, None]).T
    for y in (ref.weight_only(x, blocks, None), ref.w8a8(x, w, None)):
        assert float((y - exact).norm() / exact.norm()) < 2e-2


def _config(name: str) -> dict:
    return json.loads((FIXTURES / name / "config.json").read_text())["quantization_config"]


def test_compressed_tensors_configs_parse_and_keep_ignored_layers_dense() -> None:
    cfg = CompressedTensorsConfig.from_config(_config("gptq-w4a16-g32-sym"))
    scheme = cfg.scheme_for("model.layers.0.self_attn.qkv_proj")
    assert scheme is not None and (scheme.bits, scheme.group_size) == (4, 32)
    assert cfg.linear_method("lm_head") is None
    w8a8 = CompressedTensorsConfig.from_config(_config("w8a8-dynamic"))
    s = w8a8.scheme_for("model.layers.0.mlp.down_proj")
    assert s is not None and s.act_dynamic is True and s.fmt == "int-quantized"
    static = CompressedTensorsConfig.from_config(_config("w8a8-static-tensor"))
    s = static.scheme_for("model.layers.0.mlp.gate_up_proj")
    assert s is not None and s.act_dynamic is False and s.strategy == "tensor"
    ignored = dict(_config("gptq-w4a16-g32-sym"), ignore=["re:.*mlp.*", "lm_head"])
    cfg = CompressedTensorsConfig.from_config(ignored)
    assert cfg.scheme_for("model.layers.0.mlp.gate_up_proj") is None
    assert cfg.scheme_for("model.layers.0.self_attn.o_proj") is not None


def test_unsupported_configs_fail_with_one_line() -> None:
    with pytest.raises(ModelLoadError, match="3-bit"):
        GPTQConfig.from_config({"quant_method": "gptq", "bits": 3})
    with pytest.raises(ModelLoadError, match="version 'gemv'"):
        AWQConfig.from_config({"quant_method": "awq", "bits": 4, "version": "gemv"})
    bad = _config("gptq-w4a16-g32-sym")
    bad["config_groups"]["group_0"]["format"] = "float-quantized"
    with pytest.raises(ModelLoadError, match="float-quantized"):
        CompressedTensorsConfig.from_config(bad)


class _Caps:
    def __init__(self, quantization: tuple[str, ...]) -> None:
        self.quantization = quantization


class _FakePlatform:
    name = "fake"

    def __init__(self, quantization: tuple[str, ...]) -> None:
        self.capabilities = _Caps(quantization)


def test_resolve_errors_name_the_method() -> None:
    assert resolve(None, _FakePlatform(()), None) is None  # type: ignore[arg-type]
    with pytest.raises(ModelLoadError, match="does not support"):
        resolve({"quant_method": "gptq"}, _FakePlatform(("awq",)))  # type: ignore[arg-type]
    with pytest.raises(ModelLoadError, match="does not match"):
        resolve({"quant_method": "gptq"}, _FakePlatform(("gptq",)), "awq")  # type: ignore[arg-type]
    with pytest.raises(ModelLoadError, match="not quantized"):
        resolve(None, _FakePlatform(()), "gptq")  # type: ignore[arg-type]
    with pytest.raises(ModelLoadError, match="no installed plugin implements"):
        resolve({"quant_method": "gptq"}, _FakePlatform(("gptq",)))  # type: ignore[arg-type]


_RUNNER = """
import json, sys
from glowlm import LLM, SamplingParams
from glowlm.layers.quantization.kernels import QuantKernels
out = {}
for path in sys.argv[1:]:
    ref = json.load(open(path + "/reference.json"))
    llm = LLM(model=path, dtype="float32", max_model_len=64)
    kinds = {type(m.method).__name__: m.method.kernels.name
             for m in llm.engine.setup.model.modules() if hasattr(m, "quant_weight")}
    res = []
    for prompt in ref["prompts"]:
        o = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(
            max_tokens=8, temperature=0, prompt_logprobs=0, ignore_eos=True), use_tqdm=False)[0]
        lps = [next(iter(p.values())).logprob for p in o.prompt_logprobs[1:]]
        res.append({"logprobs": lps, "greedy": list(o.outputs[0].token_ids)})
    out[path] = {"results": res, "methods": kinds}
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def reference_runs() -> dict:
    from glowlm.layers.quantization import implemented
    from glowlm.platforms import current_platform

    platform = current_platform()
    if "compressed-tensors" not in implemented(platform):
        pytest.skip(f"the {platform.name} platform implements no compressed-tensors method")
    env = dict(os.environ, GLOWLM_DISABLE_KERNELS="1", GLOWLM_LOG_LEVEL="WARNING")
    proc = subprocess.run([sys.executable, "-c", _RUNNER,
                           *[str(FIXTURES / c) for c in REFERENCE_RUN]],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def test_every_fixture_is_listed() -> None:
    assert set(REFERENCE_RUN) <= set(CHECKPOINTS) and len(CHECKPOINTS) == 10


@pytest.mark.parametrize("name", REFERENCE_RUN)
def test_reference_path_matches_transformers(name: str, reference_runs: dict) -> None:
    run = reference_runs[str(FIXTURES / name)]
    ref = json.loads((FIXTURES / name / "reference.json").read_text())
    assert run["methods"] and set(run["methods"].values()) == {"reference"}
    tol = DYNAMIC_W8A8_TOL if name == "w8a8-dynamic" else WEIGHT_ONLY_TOL
    for got, want_lp, want_greedy in zip(run["results"], ref["prompt_logprobs"], ref["greedy"],
                                         strict=True):
        err = max(abs(a - b) for a, b in zip(got["logprobs"], want_lp, strict=True))
        assert err < tol, f"{name}: max |d logprob| {err:.3g}"
        assert got["greedy"] == want_greedy


def test_quantization_flag_must_name_the_checkpoints_method() -> None:
    from glowlm import LLM

    with pytest.raises(ModelLoadError, match="does not match the checkpoint's"):
        LLM(model=str(FIXTURES / "w8a8-dynamic"), quantization="gptq")


def test_cli_accepts_quantization() -> None:
    import argparse

    from glowlm.entrypoints.cli.engine_args import add_engine_args, engine_kwargs

    p = argparse.ArgumentParser()
    add_engine_args(p)
    args = p.parse_args(["--quantization", "awq"])
    assert engine_kwargs(args)["quantization"] == "awq"


class _PreparedLayer(nn.Module):
    def __init__(self, n: int, k: int, dtype: torch.dtype, w8a8: bool, prepared: object
                 ) -> None:
        super().__init__()
        self.input_size, self.output_sizes, self.params_dtype = k, [n], dtype
        self.quant_w8a8, self.quant_weight = w8a8, prepared


def test_reference_kernels_offer_torch_candidates_of_the_same_arithmetic() -> None:
    """On core's reference kernels (any platform) the measured choice gets torch's int8
    GEMM for W8A8 (the same integers) and its int4 GEMM for 4-bit W4A16 in 16-bit models."""
    from glowlm.layers.quantization.candidates import quant_candidates
    from glowlm.layers.quantization.method import QuantLinearMethod

    class Method(QuantLinearMethod):
        def create_weights(self, *args: object) -> None:
            raise AssertionError("not loading")

    g = torch.Generator().manual_seed(5)
    method = Method(REFERENCE_KERNELS)
    w8 = Int8Weights(torch.randint(-127, 128, (24, 64), generator=g, dtype=torch.int8),
                     torch.rand(24, generator=g) * 0.01, 0.03, 4)
    layer = _PreparedLayer(24, 64, torch.float32, True, w8)
    cands = {c.name: c for c in quant_candidates(method, layer)}
    assert list(cands) == ["reference-quant", "torch-int8"]
    x = torch.randn(7, 64, generator=g)
    torch.testing.assert_close(cands["torch-int8"].apply(layer, x, None),
                               cands["reference-quant"].apply(layer, x, None),
                               rtol=1e-6, atol=1e-6)
    q = torch.randint(0, 16, (24, 64), generator=g, dtype=torch.uint8)
    w4 = WeightOnlyInt(q, torch.rand(24, 2, generator=g) * 0.02 + 1e-3,
                       torch.randint(0, 16, (24, 2), generator=g).float(), 4, 32)
    layer = _PreparedLayer(24, 64, torch.bfloat16, False, w4)
    cands = {c.name: c for c in quant_candidates(method, layer)}
    assert list(cands) == ["reference-quant", "torch-int4"]
    xb = x.bfloat16()
    want = REFERENCE_KERNELS.weight_only(xb.float(), w4, None)
    got = cands["torch-int4"].apply(layer, xb, None).float()
    assert float((got - want).norm() / want.norm()) < 1e-2
