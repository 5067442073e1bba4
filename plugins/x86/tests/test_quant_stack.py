"""The decoder stack op with quantized projections (``rms_decoder_stack_q``).

Quantized decode streams 3-4x fewer weight bytes than bf16, so the Python between the
per-layer ops would be an even larger share of a step than it is for dense models; the
stack op runs the quantized layers in C++ too. It calls the same kernels in the same
order as the module path (``wna16_linear`` for the quantized projections), so with the
stack and without it a model gives identical tokens and, at float32, the same prompt
log-probs to float rounding. A tiny Q4_1 GGUF (llama.cpp's layout) run natively is the
model; both dtypes, since bf16 activations take the vdpbf16ps path on AVX512_BF16.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from glowlm_x86.kernels.testing import require_kernels


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("qtype, int8", [("Q4_1", "0"), ("Q4_1", "1"), ("Q8_0", "1")])
def test_quantized_layers_run_in_the_stack_op_and_match_the_module_path(
        dtype: str, qtype: str, int8: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """int8 = "1": the layers multiply int8 activations (``wna8_linear``, in the stack
    through ``bits | kActInt8``), 4-bit and 8-bit (W8A8's signed layout)."""
    require_kernels()
    from glowlm import LLM, SamplingParams
    from glowlm.testing.tiny_gguf import write_tiny_gguf
    from glowlm.testing.tiny_models import SMALL_ENGINE, make_tiny_model

    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE", "1")
    monkeypatch.setenv("GLOWLM_GGUF_INT8_ACTIVATIONS", int8)
    monkeypatch.setenv("GLOWLM_LINEAR_IMPL", "default")  # each layer's method: the stack
    path = write_tiny_gguf(make_tiny_model("mistral", tmp_path / "hf"), tmp_path / "m.gguf",
                           qtype)
    llm = LLM(str(path), platform="x86", dtype=dtype, enable_prefix_caching=False,
              **SMALL_ENGINE)
    model = llm.engine.runner.model.model
    assert hasattr(model.layers[0].self_attn.qkv_proj, "quant_weight")  # native blocks
    assert model.layers[0].self_attn.qkv_proj.quant_weight.act_block == (32 if int8 == "1"
                                                                        else 0)
    assert model.stack.fn is not None, "the stack op must accept the quantized layers"
    calls = []
    stack_fn = model.stack.fn

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out = stack_fn(*args, **kwargs)
        calls.append(out is not None)
        return out

    prompts = [{"prompt_token_ids": [5, 6, 7, 8, 9, 10, 11]}, {"prompt_token_ids": [40] * 20}]
    params = SamplingParams(max_tokens=6, temperature=0, prompt_logprobs=0, ignore_eos=True)
    model.stack.fn = counting
    fused = llm.generate(prompts, params, use_tqdm=False)
    assert any(calls), "the stack op declined every step"
    model.stack.fn = None  # the module path: layer by layer, the quantized methods
    modules = llm.generate(prompts, params, use_tqdm=False)
    for a, b in zip(fused, modules, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        la = torch.tensor([next(iter(p.values())).logprob for p in a.prompt_logprobs[1:]])
        lb = torch.tensor([next(iter(p.values())).logprob for p in b.prompt_logprobs[1:]])
        torch.testing.assert_close(la, lb, rtol=0, atol=1e-5 if dtype == "float32" else 0)


FIXTURES = Path(__file__).resolve().parents[3] / "core" / "tests" / "fixtures" / "quant"


@pytest.mark.parametrize("name", ["w8a8-dynamic", "w8a8-static-tensor", "w4a16-channel",
                                  "gptq-w4a16-g128", "w8a16-channel"])
def test_checkpoint_layers_run_in_the_stack_op(name: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The real llm-compressor / GPTQ fixtures, W8A8 (dynamic and static activation
    scales) among them: the stack op takes their layers and gives the module path's
    tokens and prompt log-probs (float32: the same kernels in the same order)."""
    require_kernels()
    from glowlm import LLM, SamplingParams
    from glowlm.testing.tiny_models import SMALL_ENGINE

    monkeypatch.setenv("GLOWLM_LINEAR_IMPL", "default")  # a measured torch win drops the stack
    llm = LLM(str(FIXTURES / name), platform="x86", dtype="float32",
              enable_prefix_caching=False, **SMALL_ENGINE)
    model = llm.engine.runner.model.model
    if model.stack.fn is None:
        pytest.fail(f"the stack op declined {name}'s layers")
    calls = []
    stack_fn = model.stack.fn

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out = stack_fn(*args, **kwargs)
        calls.append(out is not None)
        return out

    prompts = [{"prompt_token_ids": [5, 6, 7, 8, 9, 10, 11]}]
    params = SamplingParams(max_tokens=5, temperature=0, prompt_logprobs=0, ignore_eos=True)
    model.stack.fn = counting
    fused = llm.generate(prompts, params, use_tqdm=False)
    assert calls and all(calls), "the stack op declined a step"
    model.stack.fn = None
    modules = llm.generate(prompts, params, use_tqdm=False)
    assert fused[0].outputs[0].token_ids == modules[0].outputs[0].token_ids
    la = torch.tensor([next(iter(p.values())).logprob for p in fused[0].prompt_logprobs[1:]])
    lb = torch.tensor([next(iter(p.values())).logprob for p in modules[0].prompt_logprobs[1:]])
    torch.testing.assert_close(la, lb, rtol=0, atol=1e-5)
