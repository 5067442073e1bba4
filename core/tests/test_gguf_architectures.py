"""Every GGUF architecture glowlm reads, on tiny checkpoints written as llama.cpp's
converter writes them (glowlm.testing.tiny_gguf): the same weights from the GGUF file
and from the safetensors directory give the same greedy tokens, and a quantized file
gives transformers' tokens on the same file.

``mistral`` is written with GGUF architecture ``llama`` (as the converter does), so it
covers the q/k row permutation; qwen2 covers q/k/v biases and a tied head, qwen3 the
q/k norms and a head_dim other than hidden / heads, gemma3 the four norms stored as
``1 + w``, the sliding-window pattern and the query scale; gemma2 the same norms, the
alternating windows and both soft-caps from the file's keys; starcoder2 LayerNorm weights
and biases, biased projections and its ``c_fc`` / ``c_proj`` MLP as ``ffn_up`` /
``ffn_down``; phi3 its fused ``attn_qkv`` / ``ffn_up`` tensors, LongRoPE factors as the
``rope_factors_long/short`` tensors, partial rotary as ``rope.dimension_count``, the window.
"""

from __future__ import annotations

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.testing.tiny_gguf import write_tiny_gguf
from glowlm.testing.tiny_models import make_tiny_model

pytest.importorskip("gguf")

SMALL = dict(kv_cache_space_gib=0.02, block_size=32, show_progress=False, platform="generic")
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(20, 60)), [300, 12, 99, 4, 250] * 5]
GEMMA = dict(query_pre_attn_scalar=32, num_hidden_layers=6,
             layer_types=["sliding_attention"] * 5 + ["full_attention"],
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "default",
                                                    "rope_theta": 1e4}})
#: What llama.cpp's GGUF keys can describe: Gemma 3's standard layer pattern (one global
#: layer in six), query scale = head_dim, unscaled rope; the other tiny configs as they are.
#: Gemma 2: the query scale llama.cpp applies (head_dim); Starcoder2: llama.cpp has no
#: window for it, so none.
#: Llama: Llama 3.1's rope scaling, which llama.cpp writes as a rope_freqs tensor.
OVERRIDES = {"llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {}, "gemma3": GEMMA,
             "gemma2": {"query_pre_attn_scalar": 32}, "starcoder2": {"sliding_window": None},
             "phi3": {}}


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory):
    made: dict[str, tuple] = {}

    def get(arch: str, qtype: str = "F32"):
        if (arch, qtype) not in made:
            root = tmp_path_factory.mktemp(f"gguf-{arch}-{qtype}")
            model_dir = make_tiny_model(arch, root / "hf", **OVERRIDES[arch])
            made[arch, qtype] = model_dir, write_tiny_gguf(model_dir, root / "m.gguf", qtype)
        return made[arch, qtype]

    return get


def _greedy(model: str, **kw) -> list[list[int]]:
    llm = LLM(model, **SMALL, **kw)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                        use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("arch", sorted(OVERRIDES))
def test_gguf_and_safetensors_give_the_same_tokens(gguf_pair, arch, monkeypatch, tmp_path):
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    model_dir, gguf_file = gguf_pair(arch)
    assert _greedy(str(gguf_file), dtype="float32") == _greedy(str(model_dir))


def test_quantized_gguf_equals_transformers_on_the_same_file(gguf_pair, monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    _, gguf_file = gguf_pair("qwen2", "Q8_0")
    hf = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                              dtype=torch.float32).eval()
    want = []
    for p in PROMPTS:
        ids = hf.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False,
                          eos_token_id=None, pad_token_id=1)
        want.append(ids[0, len(p):].tolist())
    assert _greedy(str(gguf_file), dtype="float32") == want


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_native_blocks_equal_transformers(gguf_pair, qtype, monkeypatch, tmp_path):
    """With GLOWLM_GGUF_NATIVE=1, Q4_0/Q4_1/Q8_0 linear weights run as the platform's
    4/8-bit weight-only kernels (no dequantized copy) where it implements ``gguf``;
    tokens equal transformers' on the same file, which dequantizes it to float32.
    mistral: Llama's q/k permutation applies to the blocks' rows, scales and zeros."""
    from glowlm import envs
    from glowlm.layers.quantization import implemented
    from glowlm.layers.quantization.gguf import GGUFLinearMethod
    from glowlm.platforms import host, select_platform
    from transformers import AutoModelForCausalLM

    # The best platform here, chosen afresh (the process may have pinned generic before).
    platform = select_platform(host.live(), None, envs.get().plugins_block).platform
    if "gguf" not in implemented(platform):
        pytest.skip(f"the {platform.name} platform runs no GGUF blocks natively")
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE", "1")
    # The blocks' exactness: float32 activations, as transformers keeps them (int8 ones
    # are test_gguf.py's and test_gguf_native.py's).
    monkeypatch.setenv("GLOWLM_GGUF_INT8_ACTIVATIONS", "0")
    _, gguf_file = gguf_pair("mistral", qtype)
    hf = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                              dtype=torch.float32).eval()
    want = [hf.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False,
                        eos_token_id=None, pad_token_id=1)[0, len(p):].tolist() for p in PROMPTS]
    llm = LLM(str(gguf_file), dtype="float32", kv_cache_space_gib=0.02, block_size=32,
              show_progress=False, platform=platform.name)
    layer = llm.engine.runner.model.model.layers[0].self_attn.qkv_proj
    assert isinstance(layer.method, GGUFLinearMethod)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                        use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == want
