"""The fused decoder layers (pre-LayerNorm and RMSNorm) against the layers' own modules.

The op runs the same kernels in the same order as the module path, so the
engine's tokens *and* log-probabilities must be identical with and without it
(``GLOWLM_NO_FUSED_LAYERS=1``), in fp32 and in bf16, for batches that mix
decodes and prefill chunks; likewise for the stack ops (every layer in one call),
which the engine uses when offered, and for the per-layer ops alone. ``opcheck``
covers the schemas (the caches are mutated in place) and the fake implementations.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.testing.tiny_models import ARCHITECTURES, make_tiny_model
from glowlm_x86.kernels.testing import require_kernels

ENGINE = dict(kv_cache_space_gib=0.05, block_size=32, show_progress=False, max_model_len=128,
              platform="x86")


@pytest.fixture(autouse=True)
def kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    require_kernels()
    # The module path must run the fused ops' own kernels (glowlm's GEMV/GEMM), not the
    # measured choice's winners, which can be torch's F.linear on these tiny shapes.
    monkeypatch.setenv("GLOWLM_LINEAR_IMPL", "glowlm")


def _run(model: Path, dtype: str) -> tuple[list[list[int]], list[list[float]], str]:
    llm = LLM(str(model), dtype=dtype, **ENGINE)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 384, (n,), generator=g).tolist() for n in (5, 40, 70)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                       logprobs=0), use_tqdm=False)
    modules = list(llm.engine.runner.model.modules())
    fused = any(getattr(m, "fused", None) is not None and m.fused.fn is not None
                for m in modules)
    stack = any(getattr(m, "stack", None) is not None and m.stack.fn is not None
                for m in modules)
    return ([o.outputs[0].token_ids for o in outs],
            [[next(iter(d.values())).logprob for d in o.outputs[0].logprobs] for o in outs],
            "stack" if stack else "layers" if fused else "modules")


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_layer_equals_modules(arch: str, dtype: str, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_tiny_model(arch, tmp_path / arch)
    tokens, logprobs, path = _run(model, dtype)
    assert path == "stack"
    monkeypatch.setenv("GLOWLM_NO_FUSED_LAYERS", "1")
    tokens_ref, logprobs_ref, path_ref = _run(model, dtype)
    assert path_ref == "modules"
    assert tokens == tokens_ref
    assert logprobs == logprobs_ref  # bit for bit: the same kernels in the same order


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_per_layer_ops_without_the_stack(arch: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A platform may offer the per-layer ops alone; the model then calls them one by one.
    from glowlm_x86.platform import X86Platform

    model = make_tiny_model(arch, tmp_path / arch)
    tokens, logprobs, _ = _run(model, "bfloat16")
    ops = X86Platform.ops
    monkeypatch.setattr(X86Platform, "ops", lambda self: dataclasses.replace(
        ops(self), ln_decoder_stack=None, rms_decoder_stack=None))
    tokens_layers, logprobs_layers, path = _run(model, "bfloat16")
    assert path == "layers"
    assert (tokens, logprobs) == (tokens_layers, logprobs_layers)


def _metadata() -> tuple[torch.Tensor, ...]:
    """Block tables, query starts, lengths and slots for one decode at position 8 (block 2)
    and a 4-token prefill (block 0), with blocks of 32."""
    return (torch.tensor([[1, 0], [0, 0]], dtype=torch.int32),
            torch.tensor([0, 1, 5], dtype=torch.int32), torch.tensor([9, 4], dtype=torch.int32),
            torch.tensor([32 + 8, 0, 1, 2, 3], dtype=torch.int64))


def test_opcheck_ln_decoder_layer() -> None:
    g = torch.Generator().manual_seed(0)
    h, heads, ffn = 64, 4, 96
    cache = torch.randn(2, 4, heads, 32, h // heads, generator=g)
    tables, qsl, lens, slots = _metadata()

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.1

    args = (r(5, h), 1 + r(h), r(h), r(3 * h, h), r(3 * h), r(h, h), None, 1 + r(h), r(h),
            r(ffn, h), r(ffn), r(h, ffn), r(h), cache, tables, qsl, lens, slots, heads, 0.25,
            1e-5, "relu", 8)
    torch.library.opcheck(torch.ops.glowlm_x86.ln_decoder_layer.default, args)


def test_opcheck_rms_decoder_layer() -> None:
    g = torch.Generator().manual_seed(0)
    hidden, heads, kv_heads, hs, inter = 64, 4, 2, 16, 96
    cache = torch.randn(2, 4, kv_heads, 32, hs, generator=g)
    tables, qsl, lens, slots = _metadata()
    positions = torch.tensor([8, 0, 1, 2, 3])

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.1

    qkv_rows = (heads + 2 * kv_heads) * hs
    for residual, norms in ((None, (None, None)), (r(5, hidden), (1 + r(hs), 1 + r(hs)))):
        args = (positions, r(5, hidden), residual, 1 + r(hidden), r(qkv_rows, hidden),
                r(qkv_rows), *norms, r(64, hs), hs, True, r(hidden, heads * hs), None,
                1 + r(hidden), r(2 * inter, hidden), None, r(hidden, inter), None, cache,
                tables, qsl, lens, slots, heads, kv_heads, hs, 0.25, 1e-5, 8)
        torch.library.opcheck(torch.ops.glowlm_x86.rms_decoder_layer.default, args)


def test_opcheck_ln_decoder_stack() -> None:
    g = torch.Generator().manual_seed(0)
    h, heads, ffn = 64, 4, 96
    caches = [torch.randn(2, 4, heads, 32, h // heads, generator=g) for _ in range(2)]
    tables, qsl, lens, slots = _metadata()

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.1

    weights = [t for _ in range(2) for t in (1 + r(h), r(h), r(3 * h, h), r(3 * h), r(h, h),
                                             None, 1 + r(h), r(h), r(ffn, h), r(ffn),
                                             r(h, ffn), r(h))]
    args = (r(5, h), weights, caches, tables, qsl, lens, slots, heads, 0.25, 1e-5, "relu", 8)
    torch.library.opcheck(torch.ops.glowlm_x86.ln_decoder_stack.default, args)
    with pytest.raises(RuntimeError, match="expected 12 per layer"):
        torch.ops.glowlm_x86.ln_decoder_stack(*args[:1], weights[:-1], *args[2:])


def test_opcheck_rms_decoder_stack() -> None:
    g = torch.Generator().manual_seed(0)
    hidden, heads, kv_heads, hs, inter = 64, 4, 2, 16, 96
    caches = [torch.randn(2, 4, kv_heads, 32, hs, generator=g) for _ in range(2)]
    tables, qsl, lens, slots = _metadata()
    positions = torch.tensor([8, 0, 1, 2, 3])

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.1

    qkv_rows = (heads + 2 * kv_heads) * hs
    weights = [t for _ in range(2) for t in (
        1 + r(hidden), r(qkv_rows, hidden), r(qkv_rows), 1 + r(hs), 1 + r(hs),
        r(hidden, heads * hs), None, 1 + r(hidden), r(2 * inter, hidden), None,
        r(hidden, inter), None)]
    args = (positions, r(5, hidden), None, weights, caches, r(64, hs), hs, True, tables, qsl,
            lens, slots, heads, kv_heads, hs, 0.25, 1e-5, 8)
    torch.library.opcheck(torch.ops.glowlm_x86.rms_decoder_stack.default, args)
