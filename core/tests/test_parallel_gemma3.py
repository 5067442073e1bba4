"""Gemma 3 under tensor and pipeline parallelism: real rank processes give TP = 1's tokens.

The tiny Gemma 3 has sliding-window layers (window 12) beside a global one, 4 heads over
2 KV heads, a tied and scaled embedding and Gemma's 1 + w norms; the prompts (~70 tokens,
a 64-token shared prefix) are far longer than the window, prefill is chunked (48-token
budget), sequences are preempted and prefix-cache hits happen, so every rank's windowed
attention runs on its share of the heads (TP) or its own layers (PP: the global layer on
stage 1) through decode, chunked prefill and recomputation.
"""

from __future__ import annotations

import pytest
from glowlm.testing.parallel import greedy_tokens, rank_env, reference_tokens


@pytest.fixture(autouse=True)
def _one_thread_per_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in rank_env().items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("sizes", [{"tensor_parallel_size": 2},
                                   {"pipeline_parallel_size": 2}], ids=["tp2", "pp2"])
def test_gemma3_matches_tp1(tiny_model_dir, sizes: dict[str, int]) -> None:  # noqa: ANN001
    model = tiny_model_dir("gemma3")
    assert greedy_tokens(model, **sizes) == reference_tokens(model)


@pytest.mark.slow
def test_gemma3_tp2_pp2_matches_tp1(tiny_model_dir) -> None:  # noqa: ANN001
    assert greedy_tokens(str(tiny_model_dir("gemma3")), tensor_parallel_size=2,
                         pipeline_parallel_size=2) == reference_tokens(tiny_model_dir("gemma3"))


def test_gemma3_tp2_on_the_native_platform(tiny_model_dir, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The platform's own attention backend (x86/Zen: the sliding-window kernel while a
    sequence fits the window) per rank: TP = 2 gives that platform's TP = 1 tokens."""
    monkeypatch.delenv("GLOWLM_PLATFORM")
    model = str(tiny_model_dir("gemma3"))
    assert greedy_tokens(model, tensor_parallel_size=2) == greedy_tokens(model)
