"""``draft_model`` speculation: a small model with the target's tokenizer drafts, the
target verifies, and the output is the plain run's.

No real draft/target pair with one tokenizer is on this disk, so exactness is tested on
random-weight pairs sharing the tiny tokenizer: a smaller random Llama (it drafts, and
nearly all its drafts are rejected: rollback every step), a copy of the target with
noise on its weights (part of each draft accepted), and the target itself as its own
draft (every draft accepted). The plain engine is the reference for greedy and seeded
outputs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.config import EngineConfig, SpeculativeConfig
from glowlm.engine.spec_decode.adaptive import StepCost, plan_draft_lengths
from glowlm.errors import ConfigError, ModelLoadError
from glowlm.testing.server import ServerProcess, scrape_metrics, start_server, stop_server
from glowlm.testing.tiny_models import SMALL_ENGINE, make_tiny_model

K = 3
SETTINGS = dict(platform="generic", max_num_batched_tokens=48, **SMALL_ENGINE)


def _perturbed_copy(src: Path, dst: Path, scale: float) -> Path:
    """``src`` with Gaussian noise of ``scale`` x each matrix's std: a draft that agrees
    with the target on some tokens and not others."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    g = torch.Generator().manual_seed(7)
    for f in dst.glob("*.safetensors"):
        tensors = load_file(f)
        for t in tensors.values():
            if t.dim() >= 2:
                t.add_(torch.randn(t.shape, generator=g) * t.std() * scale)
        save_file(tensors, f, metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def dirs(tiny_model_dir, tmp_path_factory) -> dict[str, str]:
    target = tiny_model_dir("llama")
    small = make_tiny_model("llama", tmp_path_factory.mktemp("draft") / "small", seed=1,
                            hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    noisy = _perturbed_copy(target, tmp_path_factory.mktemp("draft") / "noisy", 0.6)
    return {"target": str(target), "small": str(small), "noisy": str(noisy)}


@pytest.fixture(scope="module")
def plain(dirs) -> LLM:
    return LLM(dirs["target"], **SETTINGS)


def _spec(dirs: dict[str, str], draft: str, **config: object) -> LLM:
    spec = {"model": dirs[draft], "num_speculative_tokens": K, "adaptive": False, **config}
    return LLM(dirs["target"], speculative_config=spec, **SETTINGS)


@pytest.fixture(scope="module")
def noisy(dirs) -> LLM:
    return _spec(dirs, "noisy")


def _prompts(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(5)
    return [{"prompt_token_ids": torch.randint(3, 384, (4 + 11 * i,), generator=g).tolist()}
            for i in range(n)]


def _tokens(outs) -> list[list[int]]:
    return [c.token_ids for o in outs for c in o.outputs]


def _free(llm: LLM) -> bool:
    bm = llm.engine.speculator.proposer.block_manager
    return bm.num_free_blocks == bm.num_blocks


@pytest.mark.parametrize("draft", ["small", "noisy"])
def test_greedy_identical_in_continuous_batches(dirs, plain, noisy, draft):
    spec = noisy if draft == "noisy" else _spec(dirs, draft)
    prompts = _prompts(6)
    # Lengths differ per request, so sequences leave and the batch changes mid-run.
    params = [SamplingParams(temperature=0, max_tokens=12 + 5 * i, ignore_eos=True)
              for i in range(6)]
    stats = spec.engine.speculator.stats
    for n in (1, 3, 6):
        want = _tokens(plain.generate(prompts[:n], params[:n], use_tqdm=False))
        assert _tokens(spec.generate(prompts[:n], params[:n], use_tqdm=False)) == want
    assert stats.num_drafts > 20 and stats.num_draft_tokens > stats.num_drafts
    if draft == "noisy":  # part accepted, part rolled back
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert _free(spec)  # every shadow's draft blocks given back


def test_target_as_its_own_draft_accepts_every_draft(dirs, plain):
    spec = _spec(dirs, "target")
    prompts = _prompts(4)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    assert _tokens(spec.generate(prompts, params, use_tqdm=False)) == _tokens(
        plain.generate(prompts, params, use_tqdm=False))
    st = spec.engine.speculator.stats
    assert st.num_drafts > 0 and st.num_accepted_tokens == st.num_draft_tokens
    # All k drafted and accepted while max_tokens leaves room (the last steps draft less).
    assert st.accepted_per_pos[K - 1] >= st.num_drafts - 4
    assert st.mean_acceptance_length > K


def test_seeded_sampling_is_the_plain_runs_and_reproducible(plain, noisy):
    prompts = _prompts(3)
    params = SamplingParams(temperature=0.8, top_k=40, seed=9, n=2, max_tokens=24,
                            ignore_eos=True, repetition_penalty=1.1)
    want = _tokens(plain.generate(prompts, params, use_tqdm=False))
    first = _tokens(noisy.generate(prompts, params, use_tqdm=False))
    again = _tokens(noisy.generate(prompts, params, use_tqdm=False))
    assert first == want and again == want


def test_gguf_draft_and_lora_target(dirs, plain, tmp_path):
    from glowlm.lora.request import LoRARequest
    from glowlm.testing.tiny_gguf import write_tiny_gguf
    from glowlm.testing.tiny_lora import make_peft_adapter

    prompts = _prompts(3)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    # The target's own weights as a GGUF file: read by the GGUF loader, every draft right.
    gguf = write_tiny_gguf(dirs["target"], tmp_path / "draft.gguf")
    spec = LLM(dirs["target"], speculative_config={"model": str(gguf),
                                                   "num_speculative_tokens": K,
                                                   "adaptive": False}, **SETTINGS)
    assert _tokens(spec.generate(prompts, params, use_tqdm=False)) == _tokens(
        plain.generate(prompts, params, use_tqdm=False))
    st = spec.engine.speculator.stats
    assert st.num_draft_tokens > 0 and st.num_accepted_tokens == st.num_draft_tokens
    # A LoRA target: the draft drafts with its base weights, the adapter's output comes out.
    lora = LoRARequest("a", 1, str(make_peft_adapter(dirs["target"], tmp_path / "adapter")))
    want = _tokens(LLM(dirs["target"], enable_lora=True, **SETTINGS).generate(
        prompts, params, use_tqdm=False, lora_request=lora))
    spec = LLM(dirs["target"], enable_lora=True, speculative_config={
        "model": dirs["target"], "num_speculative_tokens": K, "adaptive": False}, **SETTINGS)
    assert _tokens(spec.generate(prompts, params, use_tqdm=False, lora_request=lora)) == want
    assert spec.engine.speculator.stats.num_drafts > 0


def test_adaptive_draft_length_keeps_the_output(dirs, plain):
    spec = LLM(dirs["target"], speculative_config={"model": dirs["small"],
                                                   "num_speculative_tokens": K}, **SETTINGS)
    prompts = _prompts(3)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    want = _tokens(plain.generate(prompts, params, use_tqdm=False))
    assert _tokens(spec.generate(prompts, params, use_tqdm=False)) == want
    speculator = spec.engine.speculator
    draft_cost = speculator.proposer.cost
    assert speculator.cost.observations > 0 and draft_cost.observations > 0
    # A draft whose every forward costs a second (the target's step: milliseconds) never
    # pays: nothing is drafted and the draft runs no forward. (The measured figures are
    # this host's; the plan's arithmetic is test_plan_prices_the_draft_models_forwards.)
    draft_cost.seconds = dict.fromkeys(range(1, 4 * (K + 1) + 1), 1.0)
    drafted, forwards = speculator.stats.num_draft_tokens, draft_cost.observations
    assert _tokens(spec.generate(prompts, params, use_tqdm=False)) == want
    assert speculator.stats.num_draft_tokens == drafted
    assert draft_cost.observations == forwards


def test_refusals_are_one_line(dirs, tmp_path):
    other = make_tiny_model("llama", tmp_path / "other", vocab_size=400, hidden_size=32,
                            num_hidden_layers=1, intermediate_size=64)
    cases = [
        ({"model": str(other)}, ConfigError, "its vocabulary has 400 tokens and the target's 384"),
        ({"model": str(tmp_path / "missing")}, ModelLoadError, "(the draft model)"),
    ]
    for config, error, message in cases:
        with pytest.raises(error) as err:
            LLM(dirs["target"], speculative_config={**config, "num_speculative_tokens": 2},
                **SETTINGS)
        assert message in str(err.value) and "\n" not in str(err.value)
    draft = {"model": dirs["small"], "num_speculative_tokens": 2}
    for kwargs, message in (
        (dict(tensor_parallel_size=2), "--tensor-parallel-size 1"),
        (dict(runner="pooling"), "a pooling engine"),
        (dict(speculative_config={**draft, "draft_tensor_parallel_size": 2}),
         "draft_tensor_parallel_size must be 1"),
    ):
        with pytest.raises(ConfigError) as err:
            EngineConfig.create("m", **{"speculative_config": draft, **kwargs})
        assert message in str(err.value) and "\n" not in str(err.value)


def test_config_model_alone_implies_draft_model():
    c = SpeculativeConfig.parse('{"model": "/d", "num_speculative_tokens": 4, '
                                '"draft_tensor_parallel_size": 1}')
    assert (c.method, c.model, c.num_speculative_tokens) == ("draft_model", "/d", 4)
    with pytest.raises(ConfigError, match="needs num_speculative_tokens"):
        SpeculativeConfig.parse({"model": "/d"})
    with pytest.raises(ConfigError, match="for method 'draft_model' only"):
        SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2, "model": "/d"})


def test_plan_prices_the_draft_models_forwards():
    target = StepCost()  # a host where 4 rows cost 10 % more than 1
    for _ in range(3):
        target.observe(1, False, 0.010)
        target.observe(4, True, 0.011)
    cheap, dear = StepCost(), StepCost()
    cheap.observe(1, False, 0.001)
    dear.observe(1, False, 0.010)  # each draft forward as slow as the target's step
    assert plan_draft_lengths([0.9], [3], 1, target) == [3]  # a free proposer
    assert plan_draft_lengths([0.9], [3], 1, target, cheap, [1]) == [3]
    assert plan_draft_lengths([0.9], [3], 1, target, dear, [1]) == [0]
    # An unmeasured draft is tried (free until measured), so its cost gets measured.
    assert plan_draft_lengths([0.9], [3], 1, target, StepCost(), [1]) == [3]


def test_memory_plan_counts_the_draft(dirs):
    from glowlm.engine.memory import plan_memory
    from glowlm.model_loader.loader import read_model_dir

    config = EngineConfig.create(dirs["target"], kv_cache_space_gib=0.03)
    target, small = read_model_dir(dirs["target"]), read_model_dir(dirs["small"])
    alone = plan_memory(target, torch.float32, config, 1024)
    both = plan_memory(target, torch.float32, config, 1024, draft=small)
    assert both.draft_weights_bytes > 0 and both.draft_kv_bytes > 0
    # One KV space for both caches, split so they hold the same tokens (the small draft
    # has one layer, the target two, of the same heads).
    assert both.kv_cache_bytes + both.draft_kv_bytes == alone.kv_cache_bytes
    assert both.kv_cache_bytes == pytest.approx(2 * both.draft_kv_bytes, rel=1e-3)
    assert both.needed_bytes > alone.needed_bytes
    assert "draft model" in both.describe()


# -- the server ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(dirs, tmp_path_factory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("draft-server") / "server.log"
    config = {"model": dirs["noisy"], "num_speculative_tokens": K}
    srv = start_server(dirs["target"], log, "--block-size", "32", "--served-model-name",
                       "tiny-draft", "--speculative-config", json.dumps(config))
    yield srv
    stop_server(srv)


def test_server_serves_the_plain_text_with_a_draft_model(server, plain):
    prompt = "def hello(self): return hello(self) def"
    want = plain.generate(prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                          use_tqdm=False)[0].outputs[0].text
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    out = client.completions.create(model="tiny-draft", prompt=prompt, max_tokens=24,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert out.choices[0].text == want
    m = scrape_metrics(server.url, "tiny-draft")
    assert m["vllm:spec_decode_num_drafts_total"] > 0
