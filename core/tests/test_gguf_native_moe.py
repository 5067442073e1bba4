"""GGUF mixture-of-experts files with their expert blocks native
(glowlm.layers.quantization.moe): stacked ``ffn_*_exps`` tensors of Q4_0, Q8_0, Q5_0 and
a Q4_K_M-style mix give, in float32, the tokens and prompt log-probs (1e-4: same weight
values, only the summation order differs) of the same file dequantized; the compiled
int8 path equals core's reference kernels; TP=2 sliced and expert-parallel equal TP=1.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from glowlm import LLM
from glowlm.testing.gguf_runs import assert_same, host_platform, native_gguf_platform, run_greedy

pytest.importorskip("gguf")


def _native_platform() -> str:
    name = native_gguf_platform()
    if name is None:
        pytest.skip(f"the {host_platform().name} platform runs no GGUF blocks natively")
    return name


#: (tiny MoE architecture, its GGUF types, config overrides). The K-quant file is a
#: Q4_K_M-style mix (gate/up Q4_K, down Q6_K: one layer of 4-bit and one of 8-bit
#: blocks), on rows of 256 weights as the K-quants need.
MOE_CASES = {
    "qwen3_moe-Q4_0": ("qwen3_moe", "Q4_0", {}),
    "mixtral-Q8_0": ("mixtral", "Q8_0", {}),
    "qwen2_moe-Q5_0": ("qwen2_moe", "Q5_0", {"shared_expert_intermediate_size": 64}),
    "qwen3_moe-Q4_K_M": ("qwen3_moe", "K", {"hidden_size": 256, "moe_intermediate_size": 256,
                                            "head_dim": 64,
                                            "intermediate_size": 256}),
}


def _moe_file(case: str, tmp_path: Path) -> Path:
    from glowlm.testing.tiny_gguf import write_tiny_gguf
    from glowlm.testing.tiny_models import make_tiny_model

    arch, qtype, overrides = MOE_CASES[case]
    model_dir = make_tiny_model(arch, tmp_path / arch, **overrides)
    kind = (lambda g: "Q6_K" if "ffn_down" in g else "Q4_K") if qtype == "K" else qtype
    return write_tiny_gguf(model_dir, tmp_path / f"{case}.gguf", kind)


def _expert_layers(llm: LLM) -> list:
    from glowlm.layers.moe import FusedMoE

    return [m for m in llm.engine.runner.model.modules() if isinstance(m, FusedMoE)]


@pytest.mark.parametrize("case", list(MOE_CASES))
def test_native_experts_equal_the_dequantized_path(case: str, monkeypatch, tmp_path) -> None:
    """Stacked ``ffn_*_exps`` blocks run as each expert's weight-only matmuls (no dense
    copy of any expert is kept) and give the tokens, and in float32 the prompt log-probs
    to 1e-4, of the same file dequantized: the same weight values, only the kernels'
    summation order differs."""
    from glowlm.layers.quantization.moe import WeightOnlyMoEMethod

    platform = _native_platform()
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    monkeypatch.setenv("GLOWLM_GGUF_INT8_ACTIVATIONS", "0")  # the blocks' exactness
    path = _moe_file(case, tmp_path)
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE", "0")
    dense, want = run_greedy(path, platform)
    assert all(hasattr(m, "w13") for m in _expert_layers(dense))
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE", "1")
    llm, got = run_greedy(path, platform)
    layers = _expert_layers(llm)
    assert layers
    for m in layers:
        assert isinstance(m.method, WeightOnlyMoEMethod)
        assert not any(name.startswith(("w13", "w2")) for name, _ in m.named_parameters())
        assert len(m.quant_experts[0]) == m.num_experts
    if case.endswith("K_M"):
        assert layers[0].method.formats == {"w13": (4, 32), "w2": (8, 16)}
    assert_same(got, want)


def test_native_experts_int8_compiled_equal_the_reference(monkeypatch, tmp_path) -> None:
    """With int8 activations (ggml's arithmetic) the platform's compiled kernels give
    the experts the tokens of core's reference kernels on the same file."""
    platform = _native_platform()
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    monkeypatch.setenv("GLOWLM_GGUF_INT8_ACTIVATIONS", "1")
    path = _moe_file("qwen3_moe-Q4_K_M", tmp_path)
    _, got = run_greedy(path, platform)
    monkeypatch.setenv("GLOWLM_DISABLE_KERNELS", "1")
    _, want = run_greedy(path, platform)
    for a, b in zip(got, want, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids


@pytest.mark.parametrize("ep", [False, True], ids=["sliced", "expert-parallel"])
def test_native_experts_under_tensor_parallelism(ep: bool, monkeypatch, tmp_path) -> None:
    """TP=2: each rank holds its half of every expert's intermediate rows (gate/up) and
    columns (down, values and per-group scales sliced alike), or with
    --enable-expert-parallel half the experts whole; the tokens of TP=1."""
    from glowlm.testing.parallel import rank_env

    platform = _native_platform()
    for k, v in rank_env().items():  # ranks outnumber the cores here: unbound, 1 thread
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    monkeypatch.setenv("GLOWLM_GGUF_INT8_ACTIVATIONS", "0")
    path = _moe_file("qwen3_moe-Q4_K_M", tmp_path)
    _, want = run_greedy(path, platform)
    llm, got = run_greedy(path, platform, tensor_parallel_size=2, enable_expert_parallel=ep)
    try:
        for a, b in zip(got, want, strict=True):
            assert a.outputs[0].token_ids == b.outputs[0].token_ids
    finally:
        llm.engine.shutdown()
