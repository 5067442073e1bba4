"""Gemma 3's layers described as ``DecoderLayerWeights`` and run by a platform's stack op.

Core's part of the fused Gemma path (the x86 op itself is tested in
plugins/x86/tests/test_kernels_fused_gemma.py): the description's Gemma fields keep
it out of the Llama and OPT forms, the stack takes local and global layers in one
call (their windows travel in the layers' weights), the composed ``decoder_stack_op``
tries the platform's own op before the conversions, and — with a stack written here
in plain PyTorch from the description alone, the reference ops and the reference
attention backend (which masks the window) — the tiny Gemma 3 generates exactly what
its modules do, inside and beyond the window: the description says what the modules
compute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from glowlm import LLM, SamplingParams
from glowlm.attention.backend import AttentionLayerSpec, AttentionMetadata
from glowlm.attention.reference import ReferenceAttentionBackend
from glowlm.layers.fused import FusedStack
from glowlm.ops import reference
from glowlm.ops.fused import DecoderLayerWeights, Rotary, generic_stack_op
from glowlm.platforms import use_platform
from glowlm.platforms.generic import GenericCpuPlatform
from glowlm.testing import contract
from glowlm.testing.tiny_models import SMALL_ENGINE, VOCAB, make_tiny_model


def _gemma_like() -> DecoderLayerWeights:
    t = torch.zeros(4, 4)
    return DecoderLayerWeights(
        "rms", t, None, t, None, t, None, t, None, "gated", "gelu_tanh", t, None, t, None,
        1e-6, Rotary(t, 4, True), q_norm_weight=t, k_norm_weight=t, post_norm1_weight=t,
        post_norm2_weight=t, sliding_window=12)


def test_gemma_fields_keep_a_description_out_of_the_llama_and_opt_forms() -> None:
    gemma = _gemma_like()
    silu = dataclasses.replace(gemma, activation="silu")
    assert silu.as_rms() is None and silu.as_ln() is None  # branch norms and window
    plain = dataclasses.replace(silu, post_norm1_weight=None, post_norm2_weight=None,
                                sliding_window=None, quant=(None, "o", None, None))
    rms = plain.as_rms()
    assert rms is not None and rms.quant == (None, "o", None, None)
    assert dataclasses.replace(plain, sliding_window=4).as_rms() is None


def test_the_platforms_own_stack_is_tried_before_the_conversions() -> None:
    gemma, llama = _gemma_like(), dataclasses.replace(
        _gemma_like(), activation="silu", post_norm1_weight=None, post_norm2_weight=None,
        sliding_window=None)
    own: list[str] = []

    def gemma_only(*args):  # noqa: ANN002, ANN202
        own.append(args[3][0].activation)
        return ("gemma", None) if args[3][0].activation == "gelu_tanh" else None

    op = generic_stack_op(None, lambda *a: ("rms", None), gemma_only)
    assert op is not None and not getattr(op, "accepts_quantized", False)
    assert op(None, None, None, [gemma], [], None, None) == ("gemma", None)
    assert op(None, None, None, [llama], [], None, None) == ("rms", None)  # declined, converted
    assert own == ["gelu_tanh", "silu"]
    assert generic_stack_op(None, None, gemma_only) is gemma_only


class _Attn:
    def __init__(self, index: int, window: int | None) -> None:
        self.layer_index = index
        self.spec = AttentionLayerSpec(4, 2, 32, 0.2, window)


class _Fused:
    """A layer's FusedLayer as FusedStack reads it: admitted, dense, unsharded."""

    quantized = False
    tp_group = None

    def __init__(self) -> None:
        self.fn = lambda *a: None

    def weights(self) -> str:
        return "w"


def test_a_stack_takes_layers_that_differ_only_in_their_window() -> None:
    attention = [_Attn(0, 12), _Attn(1, None)]
    # An op without per-layer windows runs them only in steps the smallest window fits
    # (full attention equals windowed there) and declines longer ones.
    plain = FusedStack(lambda *a: "ran", [_Fused(), _Fused()], attention)
    assert plain(kv_caches=[1, 2], metadata=SimpleNamespace(max_seq_len=12)) == "ran"
    assert plain(kv_caches=[1, 2], metadata=SimpleNamespace(max_seq_len=13)) is None
    stack = FusedStack(lambda *a: a[-1], [_Fused(), _Fused()], attention,
                       per_layer_window=True)
    assert stack(kv_caches=[1, 2], metadata=None) == AttentionLayerSpec(4, 2, 32, 0.2, None)
    other = [_Attn(0, 12), _Attn(1, None)]
    other[1].spec = dataclasses.replace(other[1].spec, scale=0.3)
    assert FusedStack(lambda *a: "ran", [_Fused(), _Fused()], other,
                      per_layer_window=True).fn is None  # one call takes one scale


def _reference_stack(calls: list[int]):  # noqa: ANN202
    """Gemma layers from their descriptions alone, on core's reference ops and backend."""
    backend = ReferenceAttentionBackend()

    def stack(positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
              layers: Sequence[DecoderLayerWeights], kv_caches: Sequence[torch.Tensor],
              metadata: AttentionMetadata, spec: AttentionLayerSpec
              ) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(len(layers))
        for w, cache in zip(layers, kv_caches, strict=True):
            assert w.rotary is not None and w.post_norm1_weight is not None
            assert w.post_norm2_weight is not None and w.activation == "gelu_tanh"
            if residual is None:
                residual, h = x, reference.rms_norm(x, w.norm1_weight, w.eps)
            else:
                h, residual = reference.fused_add_rms_norm(x, residual, w.norm1_weight, w.eps)
            qs, kvs = spec.num_heads * spec.head_size, spec.num_kv_heads * spec.head_size
            q, k, v = F.linear(h, w.qkv_weight, w.qkv_bias).split([qs, kvs, kvs], dim=-1)
            q = reference.rms_norm(q.reshape(q.shape[0], -1, spec.head_size),
                                   w.q_norm_weight, w.eps)
            k = reference.rms_norm(k.reshape(k.shape[0], -1, spec.head_size),
                                   w.k_norm_weight, w.eps)
            q, k = reference.rotary_embedding(positions, q, k, w.rotary.cos_sin_cache,
                                              w.rotary.rotary_dim, w.rotary.is_neox)
            layer_spec = dataclasses.replace(spec, sliding_window=w.sliding_window)
            a = backend.forward(layer_spec, q, k, v.reshape(v.shape[0], -1, spec.head_size),
                                cache, metadata)
            o = reference.rms_norm(F.linear(a, w.o_weight, w.o_bias), w.post_norm1_weight,
                                   w.eps)
            h, residual = reference.fused_add_rms_norm(o, residual, w.norm2_weight, w.eps)
            up = reference.gelu_tanh_and_mul(F.linear(h, w.up_weight, w.up_bias))
            x = reference.rms_norm(F.linear(up, w.down_weight, w.down_bias),
                                   w.post_norm2_weight, w.eps)
        assert residual is not None
        return x, residual

    return stack


def _generate(llm: LLM) -> tuple[list[list[int]], list[list[float]]]:
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 9, 30)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(
        temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=0), use_tqdm=False)
    return ([o.outputs[0].token_ids for o in outs],
            [[next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]] for o in outs])


def test_the_description_computes_what_the_modules_do(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Both runs on the layers' own F.linear, the stack ungated: the measured linear
    # choice may pick oneDNN for some shapes and token classes (the stack then declines
    # there), whose sums round differently, and this comparison is bit for bit.
    monkeypatch.setenv("GLOWLM_LINEAR_IMPL", "default")
    model_dir = make_tiny_model("gemma3", tmp_path / "gemma3")
    platform = contract.platform_for(GenericCpuPlatform)
    assert platform is not None
    with use_platform(platform):
        llm = LLM(str(model_dir), platform="generic", dtype="float32", **SMALL_ENGINE)
        assert llm.engine.runner.model.model.stack.fn is None  # core's table: no fused op
        want = _generate(llm)
        del llm
        calls: list[int] = []
        ops = platform.ops()
        # A layer op that declines: the stack is used only where every layer has one.
        patched = dataclasses.replace(ops, decoder_stack=_reference_stack(calls),
                                      decoder_layer=lambda *a: None)
        platform.ops = lambda: patched  # type: ignore[method-assign]
        llm = LLM(str(model_dir), platform="generic", dtype="float32", **SMALL_ENGINE)
        got = _generate(llm)
    assert calls and set(calls) <= {3, 4}  # every layer per call (all but the last: prefill)
    # Bit for bit: the same reference functions and F.linear in the modules' order.
    assert got == want
