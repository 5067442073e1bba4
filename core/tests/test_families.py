"""Decoder families as declarations (glowlm/models/decoder.py).

Granite, SmolLM3 and OLMo 2 are families added as declarations only
(glowlm/models/granite.py, smollm3.py, olmo2.py): greedy tokens and prompt
log-probabilities must be transformers' on tiny random checkpoints (Granite's four
multipliers all away from 1; SmolLM3's last layer without rotary, so the pruned prefill
runs a NoPE layer; OLMo 2's norms after the branches, random q/k norm weights over the
whole projection). Phi-3, Gemma 2 and Starcoder2 likewise (phi3.py, gemma2.py,
starcoder2.py): Phi-3's fused qkv_proj / gate_up_proj tensors, LongRoPE on half of each
head (short factors: the tests serve 128 of its 256 trained positions) and a 48-token
window on every layer; Gemma 2's attention scores soft-capped at 4 (so the cap bites),
logits at 30, alternating 12-token windows, sandwich norms; Starcoder2's LayerNorms
with random weights and biases, biased projections, GELU MLP and a 48-token window.
Prompts of 70 tokens outrun every window. A family declared inside a
test shows the mechanism end to end: an MLP kind registered by name, checkpoint
renames, and the model registered under an architecture of its own.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.errors import PluginError
from glowlm.models import decoder, registry
from glowlm.models.decoder import SANDWICH, DecoderLM, DecoderSpec, GatedMLP
from glowlm.testing.pruning import assert_pruned_prefill_matches
from glowlm.testing.tiny_models import SMALL_ENGINE as SMALL
from glowlm.testing.tiny_models import VOCAB

MAX_TOKENS = 16
NEW_FAMILIES = {"granite": "GraniteForCausalLM", "smollm3": "SmolLM3ForCausalLM",
                "olmo2": "Olmo2ForCausalLM", "phi3": "Phi3ForCausalLM",
                "gemma2": "Gemma2ForCausalLM", "starcoder2": "Starcoder2ForCausalLM"}


@pytest.fixture(params=sorted(NEW_FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return request.param


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 23, 70, 41)]


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("budget", [4096, 16], ids=["plain", "chunked-prefill"])
def test_greedy_matches_transformers(tiny_model_dir, family: str, budget: int) -> None:  # noqa: ANN001
    from transformers import AutoModelForCausalLM

    model_dir = tiny_model_dir(family)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = _prompts()
    want = [hf.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False,
                        eos_token_id=None, pad_token_id=1)[0, len(p):].tolist() for p in prompts]
    llm = LLM(str(model_dir), platform="generic", max_num_batched_tokens=budget,
              max_model_len=128, **SMALL)
    assert type(llm.engine.runner.model).__name__ == NEW_FAMILIES[family]
    assert _greedy(llm, prompts) == want


def test_prompt_logits_match_transformers(tiny_model_dir, family: str) -> None:  # noqa: ANN001
    from transformers import AutoModelForCausalLM

    model_dir = tiny_model_dir(family)
    prompt = _prompts()[2]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    # 128 positions: within Phi-3's trained 256, where LongRoPE takes the short factors
    # as transformers does for this prompt (test_rope_scaling.py covers the long ones).
    llm = LLM(str(model_dir), platform="generic", max_num_batched_tokens=16,
              max_model_len=128, **SMALL)
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0),
                       use_tqdm=False)[0]
    got = torch.tensor([out.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))])
    want = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_last_layer_on_sampled_rows_only(tiny_model_dir, family: str) -> None:  # noqa: ANN001
    assert_pruned_prefill_matches(tiny_model_dir(family), "generic", VOCAB,
                                  max_model_len=128, **SMALL)


def test_a_family_declared_in_a_test(tiny_model_dir, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """Llama's math under other checkpoint names, with an MLP kind of its own: the
    declaration below is the whole model, and it reproduces Llama's tokens."""
    from safetensors.torch import load_file, save_file

    calls: list[int] = []

    class CountingMLP(GatedMLP):  # a registered MLP kind: Llama's, counting its rows
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(x.shape[0])
            return super().forward(x)

    monkeypatch.setitem(decoder.MLP_KINDS, "counting", CountingMLP)

    class RenamedLlama(DecoderLM):
        family = DecoderSpec(mlp="counting", renames=((".attention.", ".self_attn."),
                                                      (".ffn.", ".mlp.")))

    monkeypatch.setattr(registry, "_REGISTERED", {})
    registry.register_model("RenamedLlamaForCausalLM", RenamedLlama, owner="test")

    src, dst = tiny_model_dir("llama"), tmp_path / "renamed"
    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    save_file({k.replace(".self_attn.", ".attention.").replace(".mlp.", ".ffn."): v
               for k, v in state.items()}, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config,
                                                 "architectures": ["RenamedLlamaForCausalLM"]}))

    prompts = _prompts()
    want = _greedy(LLM(str(src), platform="generic", max_model_len=128, **SMALL), prompts)
    llm = LLM(str(dst), platform="generic", max_model_len=128, **SMALL)
    assert isinstance(llm.engine.runner.model, RenamedLlama)
    calls.clear()
    assert _greedy(llm, prompts) == want
    assert calls  # the registered kind ran


def test_declarations_are_checked_when_made() -> None:
    with pytest.raises(ValueError, match="mlp='no-such-mlp' is not one of"):
        class Misspelt(DecoderLM):  # the kinds are checked when the family is declared
            family = DecoderSpec(mlp="no-such-mlp")
    with pytest.raises(ValueError, match="fused='rms' is Llama's layer"):
        DecoderSpec(norms=SANDWICH)  # the Llama fused form has no branch-output norms
    assert DecoderSpec(norms=SANDWICH, fused="decoder").norms is SANDWICH
    with pytest.raises(PluginError, match="mlp kind 'gated' is already registered"):
        decoder.register_mlp_kind("gated", GatedMLP.__call__)  # one owner per kind name


def test_existing_families_keep_their_names_and_mappings() -> None:
    from glowlm.models.gemma2 import Gemma2ForCausalLM
    from glowlm.models.gemma3 import Gemma3ForCausalLM
    from glowlm.models.granite import GraniteForCausalLM
    from glowlm.models.llama import (
        LlamaForCausalLM,
        MistralForCausalLM,
        Qwen2ForCausalLM,
        Qwen3ForCausalLM,
    )
    from glowlm.models.olmo2 import Olmo2ForCausalLM
    from glowlm.models.phi3 import Phi3ForCausalLM
    from glowlm.models.smollm3 import SmolLM3ForCausalLM
    from glowlm.models.starcoder2 import Starcoder2ForCausalLM

    for cls in (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
                Gemma3ForCausalLM, GraniteForCausalLM, SmolLM3ForCausalLM, Olmo2ForCausalLM,
                Phi3ForCausalLM, Gemma2ForCausalLM, Starcoder2ForCausalLM):
        assert registry.model_class([cls.__name__]) is cls
        assert ("qkv_proj", "q_proj", "q") in cls.stacked_params
    for cls in (Gemma3ForCausalLM, Gemma2ForCausalLM, Phi3ForCausalLM, Starcoder2ForCausalLM):
        assert cls.sliding_window_attention  # windows honoured, the context not capped
    assert not LlamaForCausalLM.sliding_window_attention


def test_attention_soft_cap_reaches_the_backend(tiny_model_dir) -> None:  # noqa: ANN001
    """Gemma 2's cap is in every layer's spec, and its layers stay off the fused forms
    (their descriptions carry no cap)."""
    llm = LLM(str(tiny_model_dir("gemma2")), platform="generic", max_model_len=128, **SMALL)
    layers = llm.engine.runner.model.model.own
    assert [la.self_attn.attn.spec.logits_soft_cap for la in layers] == [4.0] * 4
    assert [la.self_attn.attn.spec.sliding_window for la in layers] == [12, None, 12, None]
    assert all(la.fused.fn is None for la in layers)


def test_a_window_as_long_as_the_context_is_dropped(tiny_model_dir) -> None:  # noqa: ANN001
    """Phi-3's 48-token window served at 48 tokens hides nothing: no window, fused form."""
    llm = LLM(str(tiny_model_dir("phi3")), platform="generic", max_model_len=48, **SMALL)
    assert all(la.self_attn.attn.spec.sliding_window is None
               for la in llm.engine.runner.model.model.own)


@pytest.mark.parametrize("arch,sizes", [("granite", {"tensor_parallel_size": 2}),
                                        ("smollm3", {"pipeline_parallel_size": 2}),
                                        ("olmo2", {"pipeline_parallel_size": 2}),
                                        ("phi3", {"tensor_parallel_size": 2}),
                                        ("starcoder2", {"tensor_parallel_size": 2})],
                         ids=["granite-tp2", "smollm3-pp2", "olmo2-pp2", "phi3-tp2",
                              "starcoder2-tp2"])
def test_new_families_under_parallelism(tiny_model_dir, monkeypatch, arch: str,  # noqa: ANN001
                                        sizes: dict[str, int]) -> None:
    """Granite's residual multiplier after the row-parallel all-reduce and its logit
    divisor on a vocabulary-sharded head; SmolLM3's NoPE layer on the second stage;
    OLMo 2's residual stream (no pre-branch norm) handed from stage to stage; Phi-3's
    fused checkpoint tensors split into q/k/v and gate/up before sharding; Starcoder2's
    row-parallel biases added once."""
    from glowlm.testing.parallel import greedy_tokens, rank_env, reference_tokens

    for k, v in rank_env().items():
        monkeypatch.setenv(k, v)
    model = tiny_model_dir(arch)
    assert greedy_tokens(model, **sizes) == reference_tokens(model)
