"""RoPE scaling (glowlm/layers/rope_scaling.py) against transformers.

The frequencies and attention factor of every ``rope_type`` equal transformers'
``ROPE_INIT_FUNCTIONS`` (float64 here, float32 there: 1e-6 relative). End to end, tiny
long-context checkpoints trained on 256 positions (Llama with Llama 3.1's, linear and
dynamic NTK scaling, Qwen2 with YaRN, Phi-3 with LongRoPE on half of each head) give
transformers' greedy tokens from a 2,400-token prompt, so every generated token sits
more than 2,048 positions past ``original_max_position_embeddings``, with the prompt
prefilled in 512-token chunks (the chunks before the original length take the same
table as the later ones); their prompt log-probabilities past position 2,304 match to
1e-4, as the families' do (measured: under 3e-6; transformers' cos/sin come from
float32 angles, glowlm's from float64).

Dynamic NTK is fixed by the served context (``--max-model-len``) where transformers
rescales with every forward's length: both agree for a prompt as long as that
context, which is what the test checks, and for contexts within the trained length.
"""

from __future__ import annotations

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.layers.rope_scaling import scaled_inv_freq
from glowlm.layers.rotary import rope_settings, rotary_dim
from glowlm.model_loader.loader import read_model_dir
from glowlm.testing.tiny_models import (
    LONG_CONTEXT,
    LONG_SERVED,
    LONG_TRAINED,
    SMALL_ENGINE,
    VOCAB,
    hf_config,
)

PROMPT_LEN, MAX_TOKENS, CHUNK = 2400, 8, 512
PAST = LONG_TRAINED + 2048  # the positions the bar is about


@pytest.mark.parametrize("arch", LONG_CONTEXT)
@pytest.mark.parametrize("seq_len", [None, 200, 3000])
def test_frequencies_match_transformers(arch: str, seq_len: int | None) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = hf_config(arch)
    theta, scaling = rope_settings(config)
    head = config.hidden_size // config.num_attention_heads
    want, want_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu",
                                                                   seq_len=seq_len)
    # transformers' seq_len is the forward's length; glowlm's context fixes it. Without
    # one, transformers takes the short LongRoPE factors (its table before any forward).
    context = seq_len or (LONG_TRAINED if arch == "phi3" else config.max_position_embeddings)
    got, factor = scaled_inv_freq(theta, rotary_dim(config, head), scaling,
                                  config.max_position_embeddings, context)
    torch.testing.assert_close(got, want.double(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(want_factor, rel=1e-12)


def test_yarn_options_match_transformers() -> None:
    """Explicit beta_fast/beta_slow, mscale/mscale_all_dim and ``truncate: false``."""
    import transformers as tf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = tf.Qwen2Config(hidden_size=64, num_attention_heads=4, max_position_embeddings=4096,
                            rope_scaling={"rope_type": "yarn", "factor": 16.0,
                                          "original_max_position_embeddings": 256,
                                          "beta_fast": 16, "beta_slow": 2, "mscale": 1.0,
                                          "mscale_all_dim": 0.5, "truncate": False})
    theta, scaling = rope_settings(config)
    want, want_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    got, factor = scaled_inv_freq(theta, 16, scaling, 4096, 4096)
    torch.testing.assert_close(got, want.double(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(want_factor, rel=1e-12) and factor != 1.0


def test_served_positions(tiny_model_dir) -> None:  # noqa: ANN001
    """Linear, dynamic and YaRN stretch the trained positions by their factor (YaRN's
    from the original length); Llama 3.1 and LongRoPE configs already give theirs."""
    for arch in LONG_CONTEXT:
        info = read_model_dir(tiny_model_dir(arch))
        assert info.max_position_embeddings == LONG_SERVED, arch


def _prompt() -> list[int]:
    g = torch.Generator().manual_seed(7)
    return torch.randint(3, VOCAB, (PROMPT_LEN,), generator=g).tolist()


@pytest.mark.parametrize("arch", LONG_CONTEXT)
def test_long_context_matches_transformers(tiny_model_dir, arch: str) -> None:  # noqa: ANN001
    from transformers import AutoModelForCausalLM

    model_dir = tiny_model_dir(arch)
    prompt = _prompt()
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    dynamic = arch == "llama_dynamic"
    with torch.no_grad():
        if dynamic:
            # transformers rescales with each forward's length, glowlm for its context
            # (max_model_len = the prompt and one token): one forward of that length is
            # where both use one table; its last prompt row gives the first token.
            new = 1
            ref = hf(torch.tensor([[*prompt, 3]])).logits[0].float().log_softmax(-1)
            want = [int(ref[PROMPT_LEN - 1].argmax())]
        else:
            new = MAX_TOKENS
            ref = hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                               eos_token_id=None, pad_token_id=1)[0, PROMPT_LEN:].tolist()
    llm = LLM(str(model_dir), platform="generic", max_num_batched_tokens=CHUNK,
              max_model_len=PROMPT_LEN + 1 if dynamic else None, **SMALL_ENGINE)
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(temperature=0, max_tokens=new, ignore_eos=True,
                                      prompt_logprobs=0), use_tqdm=False)[0]
    assert list(out.outputs[0].token_ids) == want
    rows = range(PAST, PROMPT_LEN)
    got = torch.tensor([out.prompt_logprobs[i][prompt[i]].logprob for i in rows])
    expect = ref[torch.tensor(rows) - 1, torch.tensor([prompt[i] for i in rows])]
    torch.testing.assert_close(got, expect, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["qwen2_yarn", "llama_linear"])
def test_gguf_rope_scaling(tiny_model_dir, tmp_path, arch: str) -> None:  # noqa: ANN001
    """llama.cpp's ``rope.scaling.{type,factor,original_context_length}`` keys become the
    config's ``rope_scaling``: a GGUF of the same weights (the ``llama`` file with its q/k
    rows permuted) serves the stretched context and gives the safetensors tokens and
    prompt log-probabilities past the original length."""
    pytest.importorskip("gguf")
    from glowlm.testing.tiny_gguf import write_tiny_gguf

    model_dir = tiny_model_dir(arch)
    gguf_file = write_tiny_gguf(model_dir, tmp_path / "m.gguf")
    prompt = _prompt()
    runs = []
    for model in (model_dir, gguf_file):
        llm = LLM(str(model), platform="generic", max_num_batched_tokens=CHUNK,
                  **SMALL_ENGINE)
        assert llm.engine.max_model_len == LONG_SERVED
        out = llm.generate({"prompt_token_ids": prompt},
                           SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True,
                                          prompt_logprobs=0), use_tqdm=False)[0]
        runs.append((list(out.outputs[0].token_ids),
                     torch.tensor([out.prompt_logprobs[i][prompt[i]].logprob
                                   for i in range(PAST, PROMPT_LEN)])))
    assert runs[1][0] == runs[0][0]
    torch.testing.assert_close(runs[1][1], runs[0][1], atol=1e-4, rtol=0)


def test_bad_scaling_is_one_line() -> None:
    from glowlm.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="rope scaling 'mrope' is not supported"):
        scaled_inv_freq(1e4, 16, {"rope_type": "mrope"}, 256, 256)
    with pytest.raises(ModelLoadError, match="long_factor has 3 entries, the rotary"):
        scaled_inv_freq(1e4, 16, {"rope_type": "longrope", "long_factor": [1.0] * 3,
                                  "short_factor": [1.0] * 8,
                                  "original_max_position_embeddings": 64}, 256, 256)
    with pytest.raises(ModelLoadError, match="'linear' needs 'factor'"):
        scaled_inv_freq(1e4, 16, {"rope_type": "linear"}, 256, 256)
