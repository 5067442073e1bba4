"""The measured linear choice on a whole x86 engine (compiled kernels, tiny Llama, fp32).

Each implementation pinned (glowlm's kernels, torch's F.linear) and the measured mix
give the same greedy tokens; the fused stack runs exactly where the choice says
(pinned glowlm: every class; pinned torch: none).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.layers import linear_choice
from glowlm.plugin_api import FusedStack
from glowlm.testing.tiny_models import make_tiny_model
from glowlm_x86.kernels.testing import require_kernels

ENGINE = dict(kv_cache_space_gib=0.05, block_size=32, show_progress=False, dtype="float32",
              max_model_len=256, platform="x86")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("llama", tmp_path_factory.mktemp("x86-choice"))


def _run(model_dir: Path, monkeypatch: pytest.MonkeyPatch, cache: Path, impl: str | None
         ) -> tuple[list[list[int]], LLM]:
    monkeypatch.setenv("GLOWLM_LINEAR_CHOICE_CACHE", str(cache))
    if impl is None:
        monkeypatch.delenv("GLOWLM_LINEAR_IMPL", raising=False)
    else:
        monkeypatch.setenv("GLOWLM_LINEAR_IMPL", impl)
    llm = LLM(str(model_dir), **ENGINE)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 384, (n,), generator=g).tolist() for n in (3, 40, 130)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                        use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], llm


def _stack(llm: LLM) -> FusedStack:
    model = llm.engine.setup.model
    return next(v for m in model.modules() for v in vars(m).values()
                if isinstance(v, FusedStack))


def test_every_choice_gives_the_same_tokens(model_dir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    require_kernels()
    glowlm, _ = _run(model_dir, monkeypatch, tmp_path, "glowlm")
    torch_, _ = _run(model_dir, monkeypatch, tmp_path, "torch")
    measured, _ = _run(model_dir, monkeypatch, tmp_path, None)
    plan = linear_choice.LAST_PLAN
    assert plan is not None and plan.mode == "measured" and plan.shapes
    assert glowlm == torch_ == measured
    cached, _ = _run(model_dir, monkeypatch, tmp_path, None)
    assert linear_choice.LAST_PLAN.mode == "cached" and cached == measured


def test_the_fused_stack_follows_the_pinned_choice(model_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    require_kernels()
    _, llm = _run(model_dir, monkeypatch, tmp_path, "glowlm")
    assert linear_choice.LAST_PLAN.fused_classes.get("stack") == [
        "decode", "small", "batch", "prefill"]
    assert _stack(llm).fn is not None
    _, llm = _run(model_dir, monkeypatch, tmp_path, "torch")
    assert linear_choice.LAST_PLAN.fused_classes.get("stack") == []
    assert _stack(llm).fn is None
