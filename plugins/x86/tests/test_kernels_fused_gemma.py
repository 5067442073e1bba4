"""Gemma 3's fused decoder stack (``gemma_decoder_stack``) against the model's modules.

The op runs the module path's kernels in the module path's order, so the engine's
tokens *and* log-probabilities must be identical with the stack and without any fused
op (``GLOWLM_NO_FUSED_LAYERS=1``), in fp32 and bf16, for batches that mix decodes and
prefill chunks (the tiny Gemma 3: local, local, global, local; a 12-token window):
inside the window, and past it, where the stack's local layers and the x86 attention
backend run the same windowed kernel (``paged_attention_window``). A stack that
ignored the window would be off by whole units. The per-layer op (the stack over one
layer) gives the stack's results bit for bit at every length. A tiny GGUF with Gemma 3
270M's Q4_K_M mix covers quantized projections; ``opcheck`` the schema.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.testing.tiny_models import GEMMA3_WINDOW, make_tiny_model
from glowlm_x86.kernels.testing import require_kernels

ENGINE = dict(kv_cache_space_gib=0.05, block_size=32, show_progress=False, max_model_len=128,
              platform="x86", enable_prefix_caching=False)
INSIDE = ((3, 4), (8, 4), (5, 7))     # (prompt, new tokens): every sequence <= 12 tokens
BEYOND = ((5, 10), (40, 10), (70, 10))


@pytest.fixture(autouse=True)
def kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    require_kernels()
    # The module path must run the stack's own kernels (glowlm's GEMV/GEMM), not the
    # measured choice's winners, which can be torch's F.linear on these tiny shapes.
    monkeypatch.setenv("GLOWLM_LINEAR_IMPL", "glowlm")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("gemma3", tmp_path_factory.mktemp("fused-gemma3"))


class Calls:
    """Wraps a fused op and records, per call, whether it ran (not None)."""

    def __init__(self, fn) -> None:  # noqa: ANN001
        self.fn, self.ran = fn, []

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        out = self.fn(*args, **kwargs)
        self.ran.append(out is not None)
        return out


def _generate(llm: LLM, lengths: tuple[tuple[int, int], ...], prompt_logprobs: bool = False
              ) -> tuple[list[list[int]], list[list[float]]]:
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 384, (n,), generator=g).tolist() for n, _ in lengths]
    outs = []
    for p, (_, new) in zip(prompts, lengths, strict=True):  # one request per length
        outs += llm.generate([{"prompt_token_ids": p}], SamplingParams(
            temperature=0, max_tokens=new, ignore_eos=True, logprobs=0,
            prompt_logprobs=0 if prompt_logprobs else None), use_tqdm=False)
    batch = llm.generate([{"prompt_token_ids": p} for p in prompts], [SamplingParams(
        temperature=0, max_tokens=new, ignore_eos=True, logprobs=0) for _, new in lengths],
        use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outs + batch]
    logprobs = [[next(iter(d.values())).logprob for d in o.outputs[0].logprobs]
                for o in outs + batch]
    if prompt_logprobs:
        logprobs += [[next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]]
                     for o in outs]
    return tokens, logprobs


def _instrumented(llm: LLM) -> tuple[Calls, list[Calls]]:
    model = llm.engine.runner.model.model
    assert model.stack.fn is not None, "the x86 platform must offer Gemma's stack"
    stack = model.stack.fn = Calls(model.stack.fn)
    layers = []
    for layer in model.own:
        assert layer.fused.fn is not None
        layers.append(Calls(layer.fused.fn))
        layer.fused.fn = layers[-1]
    return stack, layers


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stack_equals_modules_inside_the_window(model_dir: Path, dtype: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert max(n + new for n, new in INSIDE) <= GEMMA3_WINDOW
    llm = LLM(str(model_dir), dtype=dtype, **ENGINE)  # type: ignore[arg-type]
    stack, layers = _instrumented(llm)
    got = _generate(llm, INSIDE)
    assert stack.ran and all(stack.ran), "the stack declined a step inside the window"
    assert not any(c.ran for c in layers)
    monkeypatch.setenv("GLOWLM_NO_FUSED_LAYERS", "1")
    ref = LLM(str(model_dir), dtype=dtype, **ENGINE)  # type: ignore[arg-type]
    assert ref.engine.runner.model.model.stack.fn is None
    assert got == _generate(ref, INSIDE)  # bit for bit: the same kernels in the same order


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_beyond_the_window_the_stack_attends_the_window(model_dir: Path, dtype: str,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    llm = LLM(str(model_dir), dtype=dtype, **ENGINE)  # type: ignore[arg-type]
    stack, layers = _instrumented(llm)
    got = _generate(llm, BEYOND, prompt_logprobs=True)
    assert stack.ran and all(stack.ran), "the stack declined a step past the window"
    monkeypatch.setenv("GLOWLM_NO_FUSED_LAYERS", "1")
    ref = LLM(str(model_dir), dtype=dtype, **ENGINE)  # type: ignore[arg-type]
    assert got == _generate(ref, BEYOND, prompt_logprobs=True)  # the same windowed kernel


def test_per_layer_ops_without_the_stack(model_dir: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    # A platform may offer the per-layer op alone; the model then calls it layer by layer.
    from glowlm_x86.platform import X86Platform

    llm = LLM(str(model_dir), dtype="bfloat16", **ENGINE)  # type: ignore[arg-type]
    want = _generate(llm, BEYOND, prompt_logprobs=True)
    ops = X86Platform.ops
    monkeypatch.setattr(X86Platform, "ops", lambda self: dataclasses.replace(
        ops(self), decoder_stack=None))
    llm = LLM(str(model_dir), dtype="bfloat16", **ENGINE)  # type: ignore[arg-type]
    model = llm.engine.runner.model.model
    assert model.stack.fn is None
    layers = []
    for layer in model.own:
        layers.append(Calls(layer.fused.fn))
        layer.fused.fn = layers[-1]
    assert _generate(llm, BEYOND, prompt_logprobs=True) == want  # the same kernels, in order
    assert all(c.ran and all(c.ran) for c in layers)


def _q4_k_m_like(name: str, k: int) -> str:
    """Gemma 3 270M's Q4_K_M mix (q/k Q5_0, v Q8_0, o Q4_K, gate/up Q4_K, down Q6_K), in
    the nearest type whose blocks fit where a row is not whole 256-weight super-blocks."""
    table = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q4_K",
             "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K"}
    kind = next((v for key, v in table.items() if f"{key}.weight" in name), "Q8_0")
    if kind.endswith("_K") and k % 256:
        kind = "Q4_1" if kind == "Q4_K" else "Q5_0"
    return kind


def _gemma_gguf(root: Path) -> Path:
    from glowlm.testing.tiny_gguf import write_tiny_gguf

    model_dir = make_tiny_model(
        "gemma3", root / "hf", hidden_size=256, intermediate_size=512, num_hidden_layers=3,
        query_pre_attn_scalar=32, layer_types=["sliding_attention", "sliding_attention",
                                               "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    config = json.loads((model_dir / "config.json").read_text())
    rows = {"attn_output": config["num_attention_heads"] * config["head_dim"],
            "ffn_down": config["intermediate_size"]}
    return write_tiny_gguf(model_dir, root / "m.gguf", lambda n: _q4_k_m_like(
        n, next((k for key, k in rows.items() if key in n), config["hidden_size"])))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_quantized_projections_run_in_the_stack(dtype: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE", "1")
    path = _gemma_gguf(tmp_path)
    llm = LLM(str(path), dtype=dtype, **ENGINE)  # type: ignore[arg-type]
    model = llm.engine.runner.model.model
    bits = {getattr(model.own[0].self_attn.qkv_proj.quant_weight, "bits", None),
            getattr(model.own[0].mlp.gate_up_proj.quant_weight, "bits", None)}
    assert bits == {8, 4}  # q|k|v as 8-bit (Q5_0 + Q8_0), gate|up 4-bit: mixed per layer
    stack, _ = _instrumented(llm)
    inside, beyond = (_generate(llm, lengths, prompt_logprobs=True)
                      for lengths in (INSIDE, BEYOND[:2]))
    assert stack.ran and all(stack.ran)
    monkeypatch.setenv("GLOWLM_NO_FUSED_LAYERS", "1")
    ref = LLM(str(path), dtype=dtype, **ENGINE)  # type: ignore[arg-type]
    assert inside == _generate(ref, INSIDE, prompt_logprobs=True)
    assert beyond == _generate(ref, BEYOND[:2], prompt_logprobs=True)


def test_opcheck_gemma_decoder_stack() -> None:
    g = torch.Generator().manual_seed(0)
    hidden, heads, kv_heads, hs, inter = 64, 4, 2, 16, 96
    caches = [torch.randn(2, 4, kv_heads, 32, hs, generator=g) for _ in range(2)]
    tables = torch.tensor([[1, 0], [0, 0]], dtype=torch.int32)
    qsl, lens = torch.tensor([0, 1, 5], dtype=torch.int32), torch.tensor([9, 4], dtype=torch.int32)
    slots = torch.tensor([32 + 8, 0, 1, 2, 3], dtype=torch.int64)
    positions = torch.tensor([8, 0, 1, 2, 3])

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.1

    qkv_rows = (heads + 2 * kv_heads) * hs
    weights = [t for _ in range(2) for t in (
        1 + r(hidden), r(qkv_rows, hidden), None, 1 + r(hs), 1 + r(hs), r(hidden, heads * hs),
        None, 1 + r(hidden), 1 + r(hidden), r(2 * inter, hidden), None, r(hidden, inter), None,
        1 + r(hidden), r(64, hs))]
    for residual in (None, r(5, hidden)):
        args = (positions, r(5, hidden), residual, weights, [], [], [0, 3], caches, hs, True,
                tables, qsl, lens, slots, heads, kv_heads, hs, 0.25, 1e-6, 8)
        torch.library.opcheck(torch.ops.glowlm_x86.gemma_decoder_stack.default, args)
    with pytest.raises(RuntimeError, match="expected 15 per layer"):
        torch.ops.glowlm_x86.gemma_decoder_stack(*args[:3], weights[:-1], *args[4:])
    with pytest.raises(RuntimeError, match="1 windows for 2 layers"):
        torch.ops.glowlm_x86.gemma_decoder_stack(*args[:6], [0], *args[7:])
