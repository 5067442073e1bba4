"""LoRA adapters in the engine, against transformers + peft on the same adapter.

Adapters are made by peft on the tiny random checkpoints (ranks 8 and 16, attention and
MLP targets, rsLoRA, a rank pattern). Tokens must equal peft's greedy tokens in fp32 for
each adapter, base-model requests in the same batch must equal the base's, and a batch
that mixes more adapters than slots must still give each request its own adapter's
tokens. The reference op is checked against a plain per-row loop.
"""

from __future__ import annotations

import json

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.errors import LoRAError, RequestError
from glowlm.lora.request import LoRARequest
from glowlm.ops import reference
from glowlm.testing.tiny_gguf import write_tiny_gguf
from glowlm.testing.tiny_lora import ATTENTION, MLP, make_peft_adapter, peft_greedy, write_gguf_lora
from glowlm.testing.tiny_models import SMALL_ENGINE

PROMPTS = [[5, 17, 99, 3, 42, 7, 250, 11], [300, 12, 8, 77], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                               11, 12, 13, 14, 15, 16, 17]]
TOKENS = 12
GREEDY = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llama(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def adapters(llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return {
        "attn8": make_peft_adapter(llama, root / "attn8", r=8, alpha=16, targets=ATTENTION,
                                   seed=1),
        "all16": make_peft_adapter(llama, root / "all16", r=16, alpha=8,
                                   targets=ATTENTION + MLP, seed=2),
        "rs": make_peft_adapter(llama, root / "rs", r=8, alpha=4, targets=["q_proj", "v_proj",
                                                                              "down_proj"],
                                seed=3, use_rslora=True, rank_pattern={"down_proj": 4}),
    }


@pytest.fixture(scope="module")
def references(llama, adapters):
    out = {name: peft_greedy(llama, path, PROMPTS, TOKENS) for name, path in adapters.items()}
    out["base"] = peft_greedy(llama, None, PROMPTS, TOKENS)
    return out


@pytest.fixture(scope="module")
def engine(llama):
    return LLM(str(llama), enable_lora=True, max_loras=2, max_lora_rank=16, **SMALL_ENGINE)


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_each_adapter_matches_peft(engine, adapters, references):
    for i, (name, path) in enumerate(adapters.items(), start=1):
        got = _tokens(engine.generate(PROMPTS, GREEDY, use_tqdm=False,
                                      lora_request=LoRARequest(name, i, str(path))))
        assert got == references[name], name
        assert got != references["base"], f"{name}: the adapter changed nothing"


def test_mixed_batch_more_adapters_than_slots(engine, adapters, references):
    """Three adapters and the base in one call, two slots: each prompt its own tokens."""
    names = [*adapters, "base"]
    prompts, loras, want = [], [], []
    for j, name in enumerate(names):
        for k, p in enumerate(PROMPTS):
            prompts.append({"prompt_token_ids": p})
            loras.append(None if name == "base" else
                         LoRARequest(name, j + 1, str(adapters[name])))
            want.append(references[name][k])
    got = _tokens(engine.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras))
    assert got == want


def test_prefix_cache_keeps_adapters_apart(engine, adapters, references):
    """The same long prompt on the base and on an adapter, one after the other: the
    adapter's blocks are not the base's."""
    long = PROMPTS[2] * 4
    base = _tokens(engine.generate([long], GREEDY, use_tqdm=False))
    lora = _tokens(engine.generate([long], GREEDY, use_tqdm=False,
                                   lora_request=LoRARequest("attn8", 1, str(adapters["attn8"]))))
    again = _tokens(engine.generate([long], GREEDY, use_tqdm=False))
    assert lora != base and again == base


def test_refusals_are_one_line(engine, llama, adapters, tmp_path):
    big = make_peft_adapter(llama, tmp_path / "r32", r=32, targets=["q_proj"])
    with pytest.raises(LoRAError, match="--max-lora-rank 16"):
        engine.generate(PROMPTS[:1], GREEDY, use_tqdm=False,
                        lora_request=LoRARequest("r32", 90, str(big)))
    saved = make_peft_adapter(llama, tmp_path / "save", r=4, targets=["q_proj"],
                              modules_to_save=["lm_head"])
    with pytest.raises(LoRAError, match="modules_to_save"):
        engine.engine.add_lora(LoRARequest("save", 91, str(saved)))
    with pytest.raises(LoRAError, match="does not exist"):
        engine.engine.add_lora(LoRARequest("nope", 92, str(tmp_path / "missing")))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(LoRAError, match="broken|safetensors"):
        engine.engine.add_lora(LoRARequest("broken", 93, str(broken)))
    # Nothing was registered by the refusals, and the engine still serves.
    assert {r.lora_name for r in engine.engine.list_loras()} >= {"attn8"}
    assert not {"r32", "save", "nope", "broken"} & {r.lora_name for r in
                                                     engine.engine.list_loras()}
    assert len(_tokens(engine.generate(PROMPTS[:1], GREEDY, use_tqdm=False))[0]) == TOKENS


def test_other_base_model_is_refused(engine, tiny_model_dir, tmp_path):
    qwen = tiny_model_dir("qwen2")
    other = make_peft_adapter(qwen, tmp_path / "qwen", r=4, targets=["q_proj"],
                              layers_to_transform=[0])
    try:
        engine.engine.add_lora(LoRARequest("qwen", 94, str(other)))
    except LoRAError as exc:
        assert "different base model" in str(exc) or "adapts" in str(exc)
    else:  # same shapes by chance: then it must at least load without error
        engine.engine.remove_lora("qwen")


def test_without_enable_lora(llama, adapters):
    plain = LLM(str(llama), **SMALL_ENGINE)
    with pytest.raises(RequestError, match="--enable-lora"):
        plain.generate(PROMPTS[:1], GREEDY, use_tqdm=False,
                       lora_request=LoRARequest("attn8", 1, str(adapters["attn8"])))


def test_unload_finishes_running_requests(engine, adapters, references):
    eng = engine.engine
    req = LoRARequest("all16-b", 40, str(adapters["all16"]))
    eng.add_lora(req)
    eng.add_request("u1", {"prompt_token_ids": PROMPTS[0]}, GREEDY, lora_request=req)
    eng.step()  # running on it now
    eng.remove_lora("all16-b")
    assert "all16-b" not in {r.lora_name for r in eng.list_loras()}
    out = None
    while eng.has_unfinished_requests():
        for o in eng.step():
            out = o
    assert out is not None and out.outputs[0].token_ids == references["all16"][0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_op_is_a_per_row_update(dtype):
    g = torch.Generator().manual_seed(0)
    n, k, d_in, d_out, slots = 7, 6, 16, 24, 3
    x = torch.randn(n, d_in, generator=g).to(dtype)
    y = torch.randn(n, d_out, generator=g).to(dtype)
    a = torch.randn(slots, k, d_in, generator=g).to(dtype)
    b = torch.randn(slots, d_out, k, generator=g).to(dtype)
    row_slot = [0, 2, -1, 2, 0, -1, 1]
    groups = [(s, torch.tensor([i for i, t in enumerate(row_slot) if t == s]))
              for s in range(slots)]
    got = reference.lora_shrink_expand(y, x, a, b, groups)
    want = y.float().clone()
    for i, s in enumerate(row_slot):
        if s >= 0:
            want[i] += (x[i].float() @ a[s].float().T) @ b[s].float().T
    tol = 1e-5 if dtype == torch.float32 else 0.15
    assert torch.allclose(got.float(), want, atol=tol * want.abs().max(), rtol=0)
    assert got.dtype == dtype
    # All rows on one slot: rows=None.
    whole = reference.lora_shrink_expand(y, x, a, b, [(1, None)])
    assert torch.allclose(whole.float(), y.float() + (x.float() @ a[1].float().T)
                          @ b[1].float().T, atol=tol * want.abs().max(), rtol=0)


def test_gguf_lora_file_matches_peft(engine, llama, adapters, references, tmp_path):
    """A llama.cpp-format GGUF LoRA (q/k rows of B permuted as the converter does) gives
    the PEFT adapter's tokens."""
    path = write_gguf_lora(adapters["all16"], llama, tmp_path / "all16.gguf")
    got = _tokens(engine.generate(PROMPTS, GREEDY, use_tqdm=False,
                                  lora_request=LoRARequest("all16-gguf", 50, str(path))))
    assert got == references["all16"]


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_adapter_on_a_gguf_base(llama, adapters, references, tmp_path, qtype):
    """A PEFT adapter beside a GGUF base model: F32 blocks give peft's tokens exactly; Q8_0
    blocks (run natively) give the adapter's effect on a quantized base, checked against
    the same engine's base tokens and the F32 run (most tokens agree)."""
    base = write_tiny_gguf(llama, tmp_path / f"base-{qtype}.gguf", qtype)
    llm = LLM(str(base), tokenizer=str(llama), enable_lora=True, max_lora_rank=16,
              **SMALL_ENGINE)
    lora = LoRARequest("all16", 1, str(adapters["all16"]))
    got = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=lora))
    plain = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    if qtype == "F32":
        assert got == references["all16"] and plain == references["base"]
    else:
        assert got != plain
        same = sum(a == b for g, r in zip(got, references["all16"], strict=True)
                   for a, b in zip(g, r, strict=True))
        assert same >= 0.5 * TOKENS * len(PROMPTS), (got, references["all16"])


@pytest.mark.parametrize("layout", [{"tensor_parallel_size": 2},
                                    {"pipeline_parallel_size": 2}], ids=["tp2", "pp2"])
def test_adapters_under_parallelism(llama, adapters, references, monkeypatch, layout):
    """Real rank processes: the other rank loads each slot from the adapter's path as the
    step's inputs say; column-parallel layers shard B, row-parallel ones A (the update's
    partial sums ride the layer's all-reduce); a pipeline stage loads its own layers."""
    from glowlm.testing.parallel import rank_env

    for k, v in rank_env().items():
        monkeypatch.setenv(k, v)
    llm = LLM(str(llama), enable_lora=True, max_loras=2, max_lora_rank=16,
              **layout, **SMALL_ENGINE)
    try:
        names = ["attn8", "all16", "rs", None]
        prompts, loras, want = [], [], []
        for j, name in enumerate(names):
            for k, p in enumerate(PROMPTS):
                prompts.append({"prompt_token_ids": p})
                loras.append(None if name is None else
                             LoRARequest(name, j + 1, str(adapters[name])))
                want.append(references[name or "base"][k])
        got = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras))
        assert got == want
    finally:
        llm.engine.shutdown()
