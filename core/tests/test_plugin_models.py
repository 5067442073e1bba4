"""A plugin adds a model family without editing core, and its layers get the platform's
fused ops through the generic decoder-layer description, with no new core slot.

The plugin module below is written against ``glowlm.plugin_api`` alone: a Llama-shaped
family (named ``PlugLlamaForCausalLM``) whose layers describe themselves as
``DecoderLayerWeights``. It is announced by an entry point beside the installed ones
(the one fake: an in-process entry point) and registered through ``glowlm_models``.
On the x86 platform its layers reach x86's compiled ``rms_decoder_stack`` (C++
unchanged) through the description's conversion, and it generates exactly what core's
own Llama does on the same checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.platforms import use_platform
from glowlm.plugins import manager
from glowlm.plugins.manager import ENTRY_POINT_GROUP
from glowlm.testing import contract
from glowlm.testing.tiny_models import SMALL_ENGINE, VOCAB, make_tiny_model

MODEL_PLUGIN = '''
from glowlm.plugin_api import (
    Attention, CausalLM, DecoderLayerWeights, FusedLayer, FusedStack, MergedColumnParallelLinear,
    ParallelLMHead, QKVParallelLinear, RMSNorm, Rotary, RotaryEmbedding, RowParallelLinear,
    SiluAndMul, VocabParallelEmbedding, decoder_layer_op, decoder_stack_op, hookimpl,
    prune_rows, rope_settings)
from torch import nn

GLOWLM_PLUGIN_API = "1.0"


class Layer(nn.Module):
    def __init__(self, config, i, parts):
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        kv_heads = config.num_key_value_heads
        self.head = hidden // heads
        self.q, self.kv = heads * self.head, kv_heads * self.head
        p = f"model.layers.{i}"
        self.qkv_proj = QKVParallelLinear(hidden, self.head, heads, kv_heads, False, parts,
                                          f"{p}.self_attn.qkv_proj")
        self.o_proj = RowParallelLinear(heads * self.head, hidden, False, parts,
                                        f"{p}.self_attn.o_proj")
        theta, scaling = rope_settings(config)
        self.rotary = RotaryEmbedding(self.head, self.head, config.max_position_embeddings,
                                      theta, True, scaling, parts)
        self.attn = Attention(heads, kv_heads, self.head, self.head ** -0.5, i, parts)
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [inter, inter], False, parts,
                                                       f"{p}.mlp.gate_up_proj")
        self.down_proj = RowParallelLinear(inter, hidden, False, parts, f"{p}.mlp.down_proj")
        self.act = SiluAndMul(parts)
        self.input_layernorm = RMSNorm(hidden, config.rms_norm_eps, parts)
        self.post_attention_layernorm = RMSNorm(hidden, config.rms_norm_eps, parts)
        self.fused = FusedLayer(decoder_layer_op(parts.ops), parts, True, self.describe)

    def describe(self):
        return DecoderLayerWeights(
            norm="rms", norm1_weight=self.input_layernorm.weight, norm1_bias=None,
            qkv_weight=self.qkv_proj.weight, qkv_bias=None, o_weight=self.o_proj.weight,
            o_bias=None, norm2_weight=self.post_attention_layernorm.weight, norm2_bias=None,
            mlp="gated", activation="silu", up_weight=self.gate_up_proj.weight, up_bias=None,
            down_weight=self.down_proj.weight, down_bias=None,
            eps=self.input_layernorm.eps,
            rotary=Rotary(self.rotary.cos_sin_cache, self.rotary.rotary_dim,
                          self.rotary.is_neox))

    def forward(self, positions, x, residual, kv_caches, metadata, keep=None):
        if self.fused.fn is not None and keep is None:
            out = self.fused.fn(positions, x, residual, self.fused.weights(),
                                kv_caches[self.attn.layer_index], metadata, self.attn.spec)
            if out is not None:
                return out
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        q, k, v = self.qkv_proj(x).split([self.q, self.kv, self.kv], dim=-1)
        q, k = self.rotary(positions, q.reshape(q.shape[0], -1, self.head),
                           k.reshape(k.shape[0], -1, self.head))
        x = self.o_proj(self.attn(q, k, v, kv_caches, metadata))
        x, residual = prune_rows(keep, x, residual)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.down_proj(self.act(self.gate_up_proj(x))), residual


class PlugLlamaForCausalLM(CausalLM):
    stacked_params = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"),
                      ("qkv_proj", "v_proj", "v"), ("gate_up_proj", "gate_proj", 0),
                      ("gate_up_proj", "up_proj", 1)]

    def __init__(self, config, parts):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size,
                                                   parts, "model.embed_tokens")
        self.layers = nn.ModuleList(Layer(config, i, parts)
                                    for i in range(config.num_hidden_layers))
        self.stack = FusedStack(decoder_stack_op(parts.ops), [la.fused for la in self.layers],
                                [la.attn for la in self.layers])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, parts)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, parts, "lm_head")
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = config.num_key_value_heads
        self.head_size = config.hidden_size // config.num_attention_heads

    def rename(self, name):
        name = name.replace("model.layers.", "layers.").replace(".self_attn.", ".")
        name = name.replace(".mlp.", ".").replace("model.", "")
        return None if "rotary_emb" in name else name

    def forward(self, input_ids, positions, kv_caches, metadata, output_rows=None):
        x, residual = self.embed_tokens(input_ids), None
        prune = output_rows is not None
        out = self.stack(positions, x, None, kv_caches=kv_caches, metadata=metadata,
                         skip_last=prune)
        if out is not None:
            x, residual = out
        else:
            for layer in self.layers[:-1] if prune else self.layers:
                x, residual = layer(positions, x, residual, kv_caches, metadata)
        if prune:
            x, residual = self.layers[-1](positions, x, residual, kv_caches, metadata,
                                          output_rows)
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden):
        return self.lm_head.compute_logits(hidden)


@hookimpl
def glowlm_models():
    return {"PlugLlamaForCausalLM": "fakeplug_models:PlugLlamaForCausalLM"}
'''


@pytest.fixture
def model_plugin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """The plugin above, announced beside the installed plugins' entry points."""
    (tmp_path / "fakeplug_models.py").write_text(textwrap.dedent(MODEL_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    real = manager._entry_points()
    fake = metadata.EntryPoint(name="plugmodels", value="fakeplug_models",
                               group=ENTRY_POINT_GROUP)
    monkeypatch.setattr(manager, "_entry_points",
                        lambda: sorted([*real, fake], key=lambda e: e.name))
    yield
    sys.modules.pop("fakeplug_models", None)


def _checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    core = make_tiny_model("llama", tmp_path / "llama")
    plug = tmp_path / "plug"
    plug.mkdir()
    for f in core.iterdir():
        (plug / f.name).symlink_to(f)
    (plug / "config.json").unlink()
    cfg = json.loads((core / "config.json").read_text())
    cfg["architectures"] = ["PlugLlamaForCausalLM"]
    (plug / "config.json").write_text(json.dumps(cfg))
    return core, plug


def _x86():
    try:
        from glowlm_x86.platform import X86Platform
    except ImportError:
        return None
    platform = contract.platform_for(X86Platform)
    if platform is None or platform.kernels() is None:
        return None
    return platform


def test_a_plugin_model_runs_on_the_platforms_fused_stack_via_the_description(
        model_plugin: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No measured linear choice: it may turn the fused ops off for tiny shapes.
    monkeypatch.setenv("GLOWLM_LINEAR_IMPL", "default")
    platform = _x86()
    if platform is None:
        pytest.skip("the x86 platform or its compiled kernels do not run here")
    calls: list[int] = []
    base = platform.ops()
    real_stack = base.rms_decoder_stack

    def counting_stack(*args):  # the x86 C++ stack op, counted
        calls.append(len(args[3]))
        return real_stack(*args)

    patched = dataclasses.replace(base, rms_decoder_stack=counting_stack)
    platform.ops = lambda: patched  # type: ignore[method-assign]
    core_dir, plug_dir = _checkpoints(tmp_path)
    g = torch.Generator().manual_seed(4)
    prompts = [{"prompt_token_ids": torch.randint(3, VOCAB, (n,), generator=g).tolist()}
               for n in (6, 40)]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=2)
    runs = {}
    with use_platform(platform):
        for name, path in (("core", core_dir), ("plugin", plug_dir)):
            calls.clear()
            llm = LLM(str(path), platform="x86", dtype="float32", **SMALL_ENGINE)
            runs[name] = (llm.generate(prompts, params, use_tqdm=False), list(calls))
            if name == "plugin":
                assert type(llm.engine.setup.model).__name__ == "PlugLlamaForCausalLM"
            del llm
    (core_out, core_calls), (plug_out, plug_calls) = runs["core"], runs["plugin"]
    assert plug_calls and plug_calls == core_calls  # every step through x86's stack op
    for a, b in zip(plug_out, core_out, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert {t: v.logprob for t, v in x.items()} == {t: v.logprob for t, v in y.items()}


def test_descriptions_convert_to_the_existing_fused_forms_only_when_they_fit() -> None:
    from glowlm.ops.fused import DecoderLayerWeights, Rotary, generic_stack_op

    t = torch.zeros(4, 4)
    rms = DecoderLayerWeights("rms", t, None, t, None, t, None, t, None, "gated", "silu", t,
                              None, t, None, 1e-6, Rotary(t, 4, True))
    assert rms.as_rms() is not None and rms.as_ln() is None
    ln = dataclasses.replace(rms, norm="layer", mlp="plain", activation="gelu", rotary=None,
                             norm1_bias=t)
    assert ln.as_ln() is not None and ln.as_rms() is None
    odd = dataclasses.replace(rms, activation="gelu_tanh")  # a gated GELU: neither form
    assert odd.as_rms() is None and odd.as_ln() is None
    seen = []
    op = generic_stack_op(None, lambda *a: seen.append(a[3]) or ("out", "res"))
    assert op is not None
    layers = [rms, rms]
    assert op(None, None, None, layers, [], None, None) == ("out", "res")
    assert op(None, None, None, layers, [], None, None) == ("out", "res")
    assert seen[0] is seen[1]  # the converted list keeps its identity (platform caches)
    assert op(None, None, None, [odd], [], None, None) is None  # declined: modules run
    assert generic_stack_op(None, None) is None
