"""The contract's check of the measured linear choice on a platform: its compiled dense
kernel is a candidate everywhere a dense layer or the LM head runs, and what the choice
installs is what runs.

Why a check of its own: :func:`~glowlm.testing.contract.check_model` turns the choice off
(it tests the platform's own parts), so a platform whose compiled GEMV/GEMM never joined
the choice, and lost every layer to ``F.linear`` without being timed, would pass it.
Here the engine runs with the choice on: measured (every dense shape must have timed the
candidate in every token class), then pinned to the candidate (every dense layer and the
head dispatch to it, the profiler sees the platform's ``gemv`` and ``gemm`` ops, and the
greedy tokens equal core's reference parts in float32), then pinned to torch (none of
the platform's dense ops run).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from glowlm.platforms.interface import Match, Platform, dtype_name
from glowlm.testing.contract.common import gen

#: Row counts, one per token class (decode, small, batch, prefill).
_CLASS_ROWS = (1, 8, 32, 256)


@contextmanager
def _env(**values: str | None) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run(
    platform: Platform, dtype: torch.dtype, impl: str | None, cache: str
) -> tuple[list[list[int]], set[str], Any, Any]:
    """Greedy tokens, the op names the profiler saw while generating, the plan, the model."""
    from glowlm import LLM, SamplingParams
    from glowlm.layers import linear_choice
    from glowlm.platforms import use_platform
    from glowlm.testing.contract.model import tiny_model
    from glowlm.testing.tiny_models import SMALL_ENGINE, VOCAB

    block = max(32, platform.capabilities.block_size_multiple)
    prompts = [
        {"prompt_token_ids": torch.randint(3, VOCAB, (n,), generator=gen(n)).tolist()}
        for n in (7, 45)
    ]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    with _env(GLOWLM_LINEAR_IMPL=impl, GLOWLM_LINEAR_CHOICE_CACHE=cache), use_platform(platform):
        llm = LLM(
            str(tiny_model("llama")),
            platform=platform.name,
            dtype=dtype_name(dtype),
            **{**SMALL_ENGINE, "block_size": block},
        )
        plan = linear_choice.LAST_PLAN
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            outs = llm.generate(prompts, params, use_tqdm=False)
        seen = {e.name for e in prof.events()}
        model = llm.engine.setup.model
        del llm
    return [o.outputs[0].token_ids for o in outs], seen, plan, model


def _dense_methods(model: Any) -> list[tuple[str, Any]]:
    """(name, installed method) of every dense linear layer and the LM head."""
    from glowlm.layers.linear import LinearBase
    from glowlm.layers.linear_choice import ChosenLinearMethod
    from glowlm.ops.linear import UnquantizedLinearMethod

    out = []
    for name, module in model.named_modules():
        method = getattr(module, "method", None)
        inner = method.inner if isinstance(method, ChosenLinearMethod) else method
        if isinstance(module, LinearBase) and isinstance(inner, UnquantizedLinearMethod):
            out.append((name, method))
        elif hasattr(module, "compute_logits") and hasattr(module, "dense_linear"):
            out.append((name, getattr(module.dense_linear, "method", module.dense_linear)))
    return out


def check_linear_choice(
    platform: Platform, dtype: torch.dtype, namespace: str, candidate: str = "glowlm"
) -> None:
    """The platform's compiled dense kernel (``candidate``, its ops under
    ``torch.ops.<namespace>``) is timed by the measured choice and runs where chosen."""
    from glowlm.layers.linear_choice import ChosenLinearMethod
    from glowlm.platforms.generic import GenericCpuPlatform

    ops = {f"{namespace}::gemv", f"{namespace}::gemm"}
    with tempfile.TemporaryDirectory(prefix="glowlm-choice-") as cache:
        _, _, plan, model = _run(platform, dtype, None, cache)
        assert plan is not None and plan.mode == "measured", (
            f"linear choice not measured on {platform.name}: {plan and plan.mode}"
        )
        dense = _dense_methods(model)
        assert dense, "no dense linear layer found"
        for key, classes in plan.shapes.items():
            for cls, m in classes.items():
                assert not m.us or candidate in m.us, (
                    f"{key} {cls}: {candidate!r} was not timed (timed: {sorted(m.us)})"
                )
        for name, method in dense:
            assert isinstance(method, ChosenLinearMethod), (
                f"{name}: the measured choice installed nothing ({type(method).__name__})"
            )
            offered = {c.name for c in method.inner.linear_candidates(_module(model, name))}
            assert candidate in offered, f"{name}: {candidate!r} is not offered ({offered})"

        tokens, seen, plan, model = _run(platform, dtype, candidate, cache)
        assert plan.mode == "pinned"
        for name, method in _dense_methods(model):
            runs = {method.for_rows(r).name for r in _CLASS_ROWS}
            assert runs == {candidate}, f"{name}: pinned {candidate!r} but runs {runs}"
        assert ops <= seen, f"pinned {candidate!r}: {sorted(ops - seen)} never ran"
        if dtype == torch.float32:
            ref = GenericCpuPlatform(platform.host, Match(True, "contract reference"))
            want, _, _, _ = _run(ref, dtype, "default", cache)
            assert tokens == want, f"pinned {candidate!r}: tokens {tokens} != reference {want}"

        _, seen, _, _ = _run(platform, dtype, "torch", cache)
        assert not ops & seen, f"pinned torch, yet {sorted(ops & seen)} ran"


def _module(model: Any, name: str) -> Any:
    return model.get_submodule(name) if name else model
