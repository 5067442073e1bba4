"""Gemma 3 (text) against transformers on the tiny seeded checkpoint (core's reference parts).

The tiny model (glowlm.testing.tiny_models) has local, local, global, local layers with
a 12-token window, so prompts of 5 and 11 tokens fit the window and the others
(23 to 70 tokens, plus 16 generated) outrun it; its norms have random ``w`` (Gemma
scales by ``1 + w``) and its global layers a linearly scaled rope. Without the window
transformers' own greedy tokens change for every prompt longer than 12 tokens, so
these tests see it.

Greedy tokens must be identical (fp32). fp32 prompt log-probabilities agree within
1e-4: the same math in float32 in another order (fused q/k/v and gate/up, paged
blocks, chunks of 16 tokens), far below any logit gap that could flip a greedy
choice (weights scaled so logits span several units). bf16: within 0.125, two bf16
ulps of a logit in [8, 16): both sides round the logits to bf16 (glowlm's LM head
returns bf16 products, transformers' too), so one rounding step of the hidden state
moves a log-probability by an ulp of the logit; the test checks the logits stay
below 16.
"""

from __future__ import annotations

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.errors import ModelLoadError
from glowlm.models.gemma3 import FULL, SLIDING, layer_types, rope_for
from glowlm.testing.pruning import assert_pruned_prefill_matches
from glowlm.testing.tiny_models import GEMMA3_WINDOW, SMALL_ENGINE, VOCAB, make_tiny_model

PROMPT_LENS = (5, 11, 23, 70, 41)
MAX_TOKENS = 16


def _prompts(lens: tuple[int, ...] = PROMPT_LENS) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lens]


def _hf(model_dir, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()


def _hf_greedy(model_dir, prompts: list[list[int]]) -> list[list[int]]:
    hf = _hf(model_dir)
    outs = []
    for p in prompts:
        ids = hf.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False,
                          eos_token_id=None, pad_token_id=1)
        outs.append(ids[0, len(p):].tolist())
    return outs


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def expected(tiny_model_dir) -> list[list[int]]:
    return _hf_greedy(tiny_model_dir("gemma3"), _prompts())


def test_the_window_shapes_transformers_tokens(tiny_model_dir, expected):
    """Guards the fixture: with no window transformers itself gives other tokens for
    every prompt longer than the window, so the parity tests below see the window."""
    from transformers import AutoModelForCausalLM

    full = AutoModelForCausalLM.from_pretrained(tiny_model_dir("gemma3"), dtype=torch.float32,
                                                sliding_window=4096).eval()
    for p, want in zip(_prompts(), expected, strict=True):
        ids = full.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False,
                            eos_token_id=None, pad_token_id=1)[0, len(p):].tolist()
        if len(p) > GEMMA3_WINDOW:
            assert ids != want, len(p)


@pytest.mark.parametrize("budget,blocks", [(4096, None), (16, None), (4096, 6)],
                         ids=["plain", "chunked-prefill", "preemption"])
def test_greedy_matches_transformers(tiny_model_dir, expected, budget, blocks):
    llm = LLM(str(tiny_model_dir("gemma3")), platform="generic", max_num_batched_tokens=budget,
              num_kv_blocks=blocks, max_model_len=128, **SMALL_ENGINE)
    assert _greedy(llm, _prompts()) == expected
    if blocks:  # the cache holds fewer blocks than the batch needs
        assert llm.engine.scheduler.num_preemptions > 0


def test_cached_prefix_longer_than_the_window(tiny_model_dir):
    """Prompts sharing a 70-token prefix (two full 32-token blocks cached): the later
    ones compute only their suffix, attending through the window into cached blocks."""
    model_dir = tiny_model_dir("gemma3")
    g = torch.Generator().manual_seed(5)
    prefix = torch.randint(3, VOCAB, (70,), generator=g).tolist()
    prompts = [prefix + torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (3, 9, 17)]
    llm = LLM(str(model_dir), platform="generic", max_num_batched_tokens=16, max_model_len=128,
              **SMALL_ENGINE)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    assert sum(o.num_cached_tokens for o in outs) == 2 * 64
    assert [o.outputs[0].token_ids for o in outs] == _hf_greedy(model_dir, prompts)


@pytest.mark.parametrize("dtype,atol", [("float32", 1e-4), ("bfloat16", 0.125)])
def test_prompt_logprobs_match_transformers(tiny_model_dir, dtype, atol):
    model_dir = tiny_model_dir("gemma3")
    prompt = _prompts()[3]
    with torch.no_grad():
        logits = _hf(model_dir, getattr(torch, dtype))(torch.tensor([prompt])).logits[0]
    assert logits.abs().max() < 16  # the bf16 tolerance is two ulps of such a logit
    ref = logits.float().log_softmax(-1)
    llm = LLM(str(model_dir), platform="generic", dtype=dtype, max_num_batched_tokens=16,
              **SMALL_ENGINE)
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0),
                       use_tqdm=False)[0]
    got = torch.tensor([out.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))])
    want = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    torch.testing.assert_close(got, want, atol=atol, rtol=0)


def test_last_layer_on_sampled_rows_only(tiny_model_dir):
    assert_pruned_prefill_matches(tiny_model_dir("gemma3"), "generic", VOCAB, max_model_len=128,
                                  **SMALL_ENGINE)


def test_norms_hold_one_plus_w_in_float32(tiny_model_dir):
    """Gemma's ``1 + w`` is added once at load, in float32, also in a bf16 engine."""
    from safetensors.torch import load_file

    model_dir = tiny_model_dir("gemma3")
    state = load_file(model_dir / "model.safetensors")
    llm = LLM(str(model_dir), platform="generic", dtype="bfloat16", **SMALL_ENGINE)
    model = llm.engine.runner.model
    norms = {n: p for n, p in model.named_parameters() if "norm" in n}
    assert len(norms) == 4 * 4 + 2 * 4 + 1  # four per layer, q/k per layer, the final one
    for name, param in norms.items():
        assert param.dtype == torch.float32
        w = state[name].to(torch.bfloat16).float()  # the engine reads the tensor in its dtype
        assert torch.equal(param, 1.0 + w), name
        assert w.abs().max() > 0.1  # the fixture's w is not zero, so the 1 is tested


def test_final_logit_softcapping_and_ignored_attention_cap(tmp_path):
    """``final_logit_softcapping`` caps the logits as transformers does; transformers'
    Gemma 3 stores ``attn_logit_softcapping`` but never applies it, and neither do we."""
    model_dir = make_tiny_model("gemma3", tmp_path / "capped", final_logit_softcapping=3.0,
                                attn_logit_softcapping=1.0)
    prompt = _prompts()[4]
    with torch.no_grad():
        logits = _hf(model_dir)(torch.tensor([prompt])).logits[0]
    assert logits.abs().max() < 3.0  # capped
    llm = LLM(str(model_dir), platform="generic", **SMALL_ENGINE)
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0),
                       use_tqdm=False)[0]
    got = torch.tensor([out.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))])
    want = logits.log_softmax(-1)[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_max_model_len_is_not_capped_at_the_window(tiny_model_dir, tmp_path):
    """Gemma 3 and Mistral attend within their windows, so the context may exceed them
    (Mistral's blocks behind the window go back to the pool: test_sliding_blocks.py)."""
    llm = LLM(str(tiny_model_dir("gemma3")), platform="generic", max_model_len=256,
              **SMALL_ENGINE)
    assert llm.engine.config.max_model_len == 256 > GEMMA3_WINDOW
    mistral = make_tiny_model("mistral", tmp_path / "mistral", sliding_window=64)
    llm = LLM(str(mistral), platform="generic", max_model_len=256, **SMALL_ENGINE)
    assert llm.engine.config.max_model_len == 256 and llm.engine.block_manager.window == 64


def test_unsupported_activation_is_one_line(tmp_path):
    model_dir = make_tiny_model("gemma3", tmp_path / "relu", hidden_activation="relu")
    with pytest.raises(ModelLoadError, match="gated activation 'relu' is not supported"):
        LLM(str(model_dir), platform="generic", **SMALL_ENGINE)


def test_older_config_fields() -> None:
    """Configs written before transformers 5: ``sliding_window_pattern``,
    ``rope_local_base_freq``, ``rope_theta`` + ``rope_scaling`` (global layers only)."""
    from types import SimpleNamespace

    old = SimpleNamespace(num_hidden_layers=6, sliding_window_pattern=3,
                          rope_local_base_freq=10_000.0, rope_theta=1_000_000.0,
                          rope_scaling={"rope_type": "linear", "factor": 8.0})
    assert layer_types(old) == [SLIDING, SLIDING, FULL] * 2
    assert rope_for(old, SLIDING) == (10_000.0, None)
    assert rope_for(old, FULL) == (1_000_000.0, {"rope_type": "linear", "factor": 8.0})
    bad = SimpleNamespace(num_hidden_layers=2, layer_types=["sliding_attention", "chunked"])
    with pytest.raises(ModelLoadError, match="layer_types"):
        layer_types(bad)
