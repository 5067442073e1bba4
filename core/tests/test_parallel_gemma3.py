"""Gemma 3 under tensor and pipeline parallelism: real rank processes give TP = 1's tokens.

The tiny Gemma 3 has sliding-window layers (window 12) beside a global one, 4 heads over
2 KV heads, a tied and scaled embedding and Gemma's 1 + w norms; the prompts (~70 tokens,
a 64-token shared prefix) are far longer than the window, prefill is chunked (48-token
budget), sequences are preempted and prefix-cache hits happen, so every rank's windowed
attention runs on its share of the heads (TP) or its own layers (PP: the global layer on
stage 1) through decode, chunked prefill and recomputation.
"""

from __future__ import annotations

import os
import random

import pytest
from glowlm import LLM, SamplingParams

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
        assert llm.engine.scheduler.num_preemptions > 0, "the workload should preempt"
        return [o.outputs[0].token_ids for o in outs]
    finally:
        llm.engine.shutdown()


@pytest.fixture(autouse=True)
def _one_thread_per_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWLM_PLATFORM", os.environ.get("GLOWLM_TEST_PLATFORM", "generic"))
    monkeypatch.setenv("GLOWLM_CPU_OMP_THREADS_BIND", "nobind")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


_REFERENCE: list[list[list[int]]] = []


def reference(tiny_model_dir) -> list[list[int]]:  # noqa: ANN001
    """TP = 1 on the generic platform (computed once, after the fixture set the env)."""
    if not _REFERENCE:
        _REFERENCE.append(_tokens(str(tiny_model_dir("gemma3"))))
    return _REFERENCE[0]


@pytest.mark.parametrize("sizes", [{"tensor_parallel_size": 2},
                                   {"pipeline_parallel_size": 2}], ids=["tp2", "pp2"])
def test_gemma3_matches_tp1(tiny_model_dir, sizes: dict[str, int]) -> None:  # noqa: ANN001
    assert _tokens(str(tiny_model_dir("gemma3")), **sizes) == reference(tiny_model_dir)


@pytest.mark.slow
def test_gemma3_tp2_pp2_matches_tp1(tiny_model_dir) -> None:  # noqa: ANN001
    assert _tokens(str(tiny_model_dir("gemma3")), tensor_parallel_size=2,
                   pipeline_parallel_size=2) == reference(tiny_model_dir)


def test_gemma3_tp2_on_the_native_platform(tiny_model_dir, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The platform's own attention backend (x86/Zen: the sliding-window kernel while a
    sequence fits the window) per rank: TP = 2 gives that platform's TP = 1 tokens."""
    monkeypatch.delenv("GLOWLM_PLATFORM")
    model = str(tiny_model_dir("gemma3"))
    assert _tokens(model, tensor_parallel_size=2) == _tokens(model)
