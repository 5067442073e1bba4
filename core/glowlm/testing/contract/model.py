"""The contract's end-to-end check: a tiny seeded checkpoint generates through the engine
on the platform (its own linear method, fused layer and stack ops; the measured linear
choice off) as on core's reference parts: same greedy tokens and log-probabilities in
float32, prompt log-probabilities within 0.1 nats on average in half precision."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from glowlm.platforms.interface import Match, Platform, dtype_name
from glowlm.testing.contract.common import gen

_MODELS: dict[str, Path] = {}
_REFERENCE_RUNS: dict[tuple[str, torch.dtype], Any] = {}


def tiny_model(arch: str) -> Path:
    """A seeded tiny ``arch`` checkpoint, written once per process to a temp dir."""
    from glowlm.testing.tiny_models import make_tiny_model

    if arch not in _MODELS:
        _MODELS[arch] = make_tiny_model(arch, Path(tempfile.mkdtemp(prefix="glowlm-contract-"))
                                        / arch)
    return _MODELS[arch]


def _generate(platform: Platform, arch: str, dtype: torch.dtype) -> list[Any]:
    from glowlm import LLM, SamplingParams
    from glowlm.platforms import use_platform
    from glowlm.testing.tiny_models import SMALL_ENGINE, VOCAB

    block = max(32, platform.capabilities.block_size_multiple)
    prompts = [{"prompt_token_ids": torch.randint(3, VOCAB, (n,), generator=gen(n)).tolist()}
               for n in (7, 45)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1,
                            prompt_logprobs=1)
    # The platform's own parts, fused ops included: no measured linear choice, which
    # may hand small layers to torch's F.linear (core's tests cover that choice).
    saved = os.environ.get("GLOWLM_LINEAR_IMPL")
    os.environ["GLOWLM_LINEAR_IMPL"] = "default"
    try:
        with use_platform(platform):
            llm = LLM(str(tiny_model(arch)), platform=platform.name, dtype=dtype_name(dtype),
                      **{**SMALL_ENGINE, "block_size": block})
            try:
                return llm.generate(prompts, params, use_tqdm=False)
            finally:
                del llm
    finally:
        if saved is None:
            os.environ.pop("GLOWLM_LINEAR_IMPL", None)
        else:
            os.environ["GLOWLM_LINEAR_IMPL"] = saved


def _prompt_logprobs(out: Any) -> list[float]:
    ids = out.prompt_token_ids
    return [step[tok].logprob for tok, step in zip(ids[1:], (out.prompt_logprobs or [])[1:],
                                                   strict=True)]


def check_model(platform: Platform, dtype: torch.dtype, arch: str = "llama") -> None:
    """A tiny ``arch`` model generates on ``platform`` as on core's reference parts."""
    from glowlm.platforms.generic import GenericCpuPlatform

    got = _generate(platform, arch, dtype)
    key = (arch, dtype)
    if key not in _REFERENCE_RUNS:
        ref_platform = GenericCpuPlatform(platform.host, Match(True, "contract reference"))
        _REFERENCE_RUNS[key] = _generate(ref_platform, arch, dtype)
    want = _REFERENCE_RUNS[key]
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        what = f"tiny {arch} ({dtype_name(dtype)}) prompt {i}"
        assert len(a.outputs[0].token_ids) == len(b.outputs[0].token_ids), what
        pa, pb = _prompt_logprobs(a), _prompt_logprobs(b)
        assert all(torch.isfinite(torch.tensor(pa))), f"{what}: non-finite log-probabilities"
        if dtype == torch.float32:
            assert a.outputs[0].token_ids == b.outputs[0].token_ids, (
                f"{what}: tokens {a.outputs[0].token_ids} != reference {b.outputs[0].token_ids}")
            worst = max(abs(x - y) for x, y in zip(pa, pb, strict=True))
            assert worst < 1e-3, f"{what}: prompt log-probabilities differ by up to {worst:.2e}"
        else:
            mean = sum(abs(x - y) for x, y in zip(pa, pb, strict=True)) / len(pa)
            assert mean < 0.1, f"{what}: prompt log-probabilities differ by {mean:.3f} on average"


def check_model_layernorm(platform: Platform, dtype: torch.dtype) -> None:
    """:func:`check_model` on the OPT family (LayerNorm layers, the other fused form)."""
    check_model(platform, dtype, arch="opt")
