"""glowlm against transformers on tiny random checkpoints of every architecture.

Greedy tokens must be identical. Prompt logits must agree within 1e-4
(absolute, fp32): both sides run the same math in float32 but in different
orders (fused qkv, chunked attention over paged blocks), which moves the last
bits; 1e-4 is far below any logit gap that could flip a greedy choice in these
models (weights scaled so logits span several units).
"""

from __future__ import annotations

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.errors import ModelLoadError
from glowlm.testing.pruning import assert_pruned_prefill_matches
from glowlm.testing.tiny_models import SMALL_ENGINE as SMALL

PROMPT_LENS = (5, 23, 70, 30, 41)
MAX_TOKENS = 16


def _prompts(vocab: int = 384) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _hf_greedy(model_dir, prompts):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    for p in prompts:
        ids = hf.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False,
                          eos_token_id=None, pad_token_id=1)
        outs.append(ids[0, len(p):].tolist())
    return hf, outs


@pytest.mark.parametrize("budget,blocks", [(4096, None), (16, None), (4096, 5)],
                         ids=["plain", "chunked-prefill", "preemption"])
def test_greedy_matches_transformers(tiny_model_dir, arch, budget, blocks):
    model_dir = tiny_model_dir(arch)
    prompts = _prompts()
    _, expected = _hf_greedy(model_dir, prompts)
    llm = LLM(str(model_dir), platform="generic", max_num_batched_tokens=budget,
              num_kv_blocks=blocks, max_model_len=128, **SMALL)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    if blocks:  # the cache holds fewer blocks than the batch needs
        assert llm.engine.scheduler.num_preemptions > 0
        assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_prompt_logits_match_transformers(tiny_model_dir, arch):
    model_dir = tiny_model_dir(arch)
    prompt = _prompts()[2]
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    llm = LLM(str(model_dir), platform="generic", max_num_batched_tokens=16, **SMALL)
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0),
                       use_tqdm=False)[0]
    assert out.prompt_logprobs[0] is None
    got = torch.tensor([out.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))])
    want = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_unknown_architecture_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["FooForCausalLM"]}')
    with pytest.raises(ModelLoadError, match="supported: .*GPT2LMHeadModel"):
        LLM(str(tmp_path), **SMALL)


def test_missing_tensor_is_named(tiny_model_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    src = tiny_model_dir("llama")
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    state = load_file(tmp_path / "model.safetensors")
    del state["model.layers.1.mlp.down_proj.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="model.layers.1.mlp.down_proj.weight"):
        LLM(str(tmp_path), **SMALL)


def test_wrong_shape_is_named(tiny_model_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    src = tiny_model_dir("qwen2")
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    state = load_file(tmp_path / "model.safetensors")
    state["model.norm.weight"] = torch.ones(65)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"model.norm.weight.*\(65,\)"):
        LLM(str(tmp_path), **SMALL)


def test_pickle_weights_refused_without_flag(tiny_model_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file

    src = tiny_model_dir("gpt2")
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    torch.save(load_file(src / "model.safetensors"), tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="--allow-pickle"):
        LLM(str(tmp_path), **SMALL)
    llm = LLM(str(tmp_path), allow_pickle=True, **SMALL)
    out = llm.generate("def", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) >= 1


def test_sharded_checkpoint_loads(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    src = tiny_model_dir("llama")
    hf = AutoModelForCausalLM.from_pretrained(src)
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    assert (tmp_path / "model.safetensors.index.json").exists()
    prompt = {"prompt_token_ids": [5, 6, 7, 8]}
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    a = LLM(str(src), **SMALL).generate(prompt, params, use_tqdm=False)[0]
    b = LLM(str(tmp_path), **SMALL).generate(prompt, params, use_tqdm=False)[0]
    assert a.outputs[0].token_ids == b.outputs[0].token_ids



def test_last_layer_on_sampled_rows_only(tiny_model_dir, arch):
    assert_pruned_prefill_matches(tiny_model_dir(arch), "generic", 384, max_model_len=128,
                                  **SMALL)
