"""Tensor and pipeline parallelism: real rank processes give TP = 1's greedy tokens.

Every engine here is a real group: rank 0 in the test process, the others spawned,
shared-memory collectives between them. The workload exercises chunked prefill
(a 48-token budget against ~70-token prompts), preemption (too few KV blocks for
all sequences at once) and prefix-cache hits (prompts sharing a 64-token prefix).
Ranks are oversubscribed on small machines (GLOWLM_CPU_OMP_THREADS_BIND=nobind,
one OpenMP thread per rank).
"""

from __future__ import annotations

import os
import random

import pytest
from glowlm import LLM, SamplingParams
from glowlm.errors import ConfigError

ENGINE = dict(block_size=32, max_num_batched_tokens=48, max_num_seqs=4, num_kv_blocks=8,
              kv_cache_space_gib=0.02, show_progress=False)


def _prompts() -> list[list[int]]:
    rng = random.Random(1)
    shared = [rng.randrange(3, 384) for _ in range(64)]
    prompts = [shared + [rng.randrange(3, 384) for _ in range(rng.randrange(3, 12))]
               for _ in range(4)]
    return prompts + [[rng.randrange(3, 384) for _ in range(rng.randrange(60, 90))]
                      for _ in range(3)]


def _tokens(model: str, **kwargs: object) -> list[list[int]]:
    llm = LLM(model, **ENGINE, **kwargs)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in _prompts()],
                            SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),
                            use_tqdm=False)
        preempted = getattr(llm.engine.scheduler, "num_preemptions", None)
        if preempted is not None:
            assert preempted > 0, "the workload should preempt"
        return [o.outputs[0].token_ids for o in outs]
    finally:
        llm.engine.shutdown()


@pytest.fixture(autouse=True)
def _one_thread_per_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWLM_PLATFORM", os.environ.get("GLOWLM_TEST_PLATFORM", "generic"))
    monkeypatch.setenv("GLOWLM_CPU_OMP_THREADS_BIND", "nobind")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


_REFERENCE: dict[str, list[list[int]]] = {}


def reference(tiny_model_dir, arch: str) -> list[list[int]]:  # noqa: ANN001
    if arch not in _REFERENCE:
        _REFERENCE[arch] = _tokens(str(tiny_model_dir(arch)))
    return _REFERENCE[arch]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tp2_matches_tp1(tiny_model_dir, arch: str) -> None:  # noqa: ANN001
    """llama: GQA (4 heads, 2 KV heads), untied head; gpt2: fused c_attn, biases, tied."""
    assert _tokens(str(tiny_model_dir(arch)), tensor_parallel_size=2) == \
        reference(tiny_model_dir, arch)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "opt", "mistral"])
def test_tp2_matches_tp1_more_architectures(tiny_model_dir, arch: str) -> None:  # noqa: ANN001
    assert _tokens(str(tiny_model_dir(arch)), tensor_parallel_size=2) == \
        reference(tiny_model_dir, arch)


def test_tp4_replicates_kv_heads(tiny_model_dir) -> None:  # noqa: ANN001
    """TP 4 > 2 KV heads: each KV head lives on two ranks."""
    assert _tokens(str(tiny_model_dir("llama")), tensor_parallel_size=4) == \
        reference(tiny_model_dir, "llama")


def test_tp_that_does_not_divide_heads_is_refused(tiny_model_dir) -> None:  # noqa: ANN001
    with pytest.raises(Exception, match="not divisible|cannot be split"):
        LLM(str(tiny_model_dir("llama")), tensor_parallel_size=3, **ENGINE)


def test_bad_sizes_are_config_errors(tiny_model_dir) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError, match="--tensor-parallel-size must be an integer >= 1"):
        LLM(str(tiny_model_dir("llama")), tensor_parallel_size=0, **ENGINE)
