"""Mixture-of-experts families against transformers (glowlm/models/moe.py): greedy
tokens and prompt log-probabilities on tiny random checkpoints of Qwen3-MoE (a dense
layer among sparse ones, renormalized top-k), Qwen2-MoE (shared expert and its gate),
Mixtral (``block_sparse_moe`` names) and OLMoE (q/k norm over the projection), fp32;
the same tokens under TP=2 (each rank a slice of every expert) and PP=2."""

from __future__ import annotations

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.testing.tiny_models import MOE_ARCHITECTURES, VOCAB
from glowlm.testing.tiny_models import SMALL_ENGINE as SMALL

MAX_TOKENS = 12
CLASSES = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
           "mixtral": "MixtralForCausalLM", "olmoe": "OlmoeForCausalLM"}


@pytest.fixture(params=MOE_ARCHITECTURES)
def moe(request: pytest.FixtureRequest) -> str:
    return request.param


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (4, 19, 57)]


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _hf_greedy(model_dir, prompts: list[list[int]]) -> list[list[int]]:  # noqa: ANN001
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return [hf.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False,
                        eos_token_id=None, pad_token_id=1)[0, len(p):].tolist() for p in prompts]


@pytest.mark.parametrize("budget", [4096, 16], ids=["plain", "chunked-prefill"])
def test_greedy_matches_transformers(tiny_model_dir, moe: str, budget: int) -> None:  # noqa: ANN001
    model_dir = tiny_model_dir(moe)
    prompts = _prompts()
    llm = LLM(str(model_dir), platform="generic", max_num_batched_tokens=budget,
              max_model_len=128, **SMALL)
    assert type(llm.engine.runner.model).__name__ == CLASSES[moe]
    assert _greedy(llm, prompts) == _hf_greedy(model_dir, prompts)


def test_prompt_logprobs_match_transformers(tiny_model_dir, moe: str) -> None:  # noqa: ANN001
    from transformers import AutoModelForCausalLM

    model_dir = tiny_model_dir(moe)
    prompt = _prompts()[2]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    llm = LLM(str(model_dir), platform="generic", **SMALL)
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0),
                       use_tqdm=False)[0]
    got = torch.tensor([out.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))])
    want = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_a_layer_is_dense_or_sparse_as_the_config_says(tiny_model_dir) -> None:  # noqa: ANN001
    from glowlm.layers.moe import MoEMLP
    from glowlm.models.decoder import GatedMLP

    llm = LLM(str(tiny_model_dir("qwen3_moe")), platform="generic", **SMALL)
    kinds = [type(layer.mlp) for layer in llm.engine.runner.model.model.layers]
    assert kinds == [MoEMLP, GatedMLP, MoEMLP]  # mlp_only_layers=[1]


def test_a_missing_expert_is_one_line(tmp_path) -> None:  # noqa: ANN001
    from glowlm.errors import ModelLoadError
    from glowlm.testing.tiny_models import make_tiny_model
    from safetensors.torch import load_file, save_file

    model_dir = make_tiny_model("mixtral", tmp_path / "m")
    tensors = load_file(model_dir / "model.safetensors")
    del tensors["model.layers.1.block_sparse_moe.experts.5.w3.weight"]
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"experts\.w13 shard 5\.up"):
        LLM(str(model_dir), platform="generic", **SMALL)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [{"tensor_parallel_size": 2},
                                    {"pipeline_parallel_size": 2},
                                    {"tensor_parallel_size": 2, "enable_expert_parallel": True}],
                         ids=["tp2", "pp2", "tp2-ep"])
@pytest.mark.parametrize("arch", ["qwen2_moe", "mixtral"])
def test_parallel_gives_the_single_process_tokens(tiny_model_dir, arch: str,  # noqa: ANN001
                                                  layout: dict[str, int],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from glowlm.testing.parallel import rank_env

    for k, v in rank_env().items():  # ranks outnumber the cores here: unbound, 1 thread
        monkeypatch.setenv(k, v)
    model_dir = tiny_model_dir(arch)
    prompts = _prompts()
    want = _greedy(LLM(str(model_dir), platform="generic", **SMALL), prompts)
    llm = LLM(str(model_dir), platform="generic", **layout, **SMALL)
    try:
        assert _greedy(llm, prompts) == want
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe", "mixtral"])
def test_a_gguf_file_gives_the_checkpoints_tokens(tiny_model_dir, tmp_path, arch: str) -> None:  # noqa: ANN001
    """llama.cpp's layout of the same weights (stacked ``ffn_*_exps`` experts, the router
    as ``ffn_gate_inp``, Qwen2-MoE's ``*_shexp``, Mixtral as ``llama`` with experts)."""
    from glowlm.testing.tiny_gguf import write_tiny_gguf

    model_dir = tiny_model_dir(arch)
    path = write_tiny_gguf(model_dir, tmp_path / f"{arch}.gguf")
    prompts = _prompts()
    want = _greedy(LLM(str(model_dir), platform="generic", **SMALL), prompts)
    llm = LLM(str(path), platform="generic", **SMALL)
    assert type(llm.engine.runner.model).__name__ == CLASSES[arch]
    assert _greedy(llm, prompts) == want


def test_expert_parallel_gives_the_single_process_tokens(tiny_model_dir,  # noqa: ANN001
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """--enable-expert-parallel at TP=2 (Qwen2-MoE: routed experts split 4 + 4 between
    the ranks, the shared expert sliced as a dense MLP): the tokens of one process, and
    each rank holds only its own experts, whole."""
    from glowlm.testing.parallel import rank_env

    for k, v in rank_env().items():
        monkeypatch.setenv(k, v)
    model_dir = tiny_model_dir("qwen2_moe")
    prompts = _prompts()
    want = _greedy(LLM(str(model_dir), platform="generic", **SMALL), prompts)
    llm = LLM(str(model_dir), platform="generic", tensor_parallel_size=2,
              enable_expert_parallel=True, **SMALL)
    try:
        experts = llm.engine.runner.model.model.layers[0].mlp.experts
        assert (experts.local_experts, experts.first_expert) == (4, 0)
        assert tuple(experts.w13.shape) == (4, 64, 64)  # 4 whole experts of 2 x 32 rows
        assert _greedy(llm, prompts) == want
    finally:
        llm.engine.shutdown()


def test_expert_parallel_needs_whole_experts_per_rank() -> None:
    """6 experts over 4 ranks: one line naming the flag (a layer, no processes)."""
    from glowlm.distributed.parallel import ParallelState
    from glowlm.errors import GlowlmError
    from glowlm.layers.context import ModelParts
    from glowlm.layers.moe import FusedMoE

    parts = ModelParts(dtype=torch.float32, parallel=ParallelState(tp_rank=1, tp_size=2),
                       expert_parallel=True)
    layer = FusedMoE(8, 2, 64, 32, True, parts, "mlp.experts")
    assert (layer.local_experts, layer.first_expert, layer.inter) == (4, 4, 32)
    parts.parallel = ParallelState(tp_rank=0, tp_size=4)
    with pytest.raises(GlowlmError, match=r"experts \(--enable-expert-parallel\)"):
        FusedMoE(6, 2, 64, 32, True, parts, "mlp.experts")
