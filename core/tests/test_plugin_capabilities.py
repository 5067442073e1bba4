"""Capabilities list only what runs: every installed platform's advertised dtypes run a
tiny model, every advertised quantization method is implemented for it by some plugin,
and each method with a recorded tiny checkpoint (fixtures/quant: compressed-tensors;
there is none in the native AWQ or GPTQ format) runs it.

A platform that cannot run on this host is built for a recorded host of its family
(glowlm.testing.hosts); its parts then run here (the Arm, IBM Z and Apple platforms
hand out core's reference parts; x86 caps its kernels by this CPU), so what it
advertises is still exercised. `glowlm platforms` shows exactly these capabilities.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from glowlm import envs
from glowlm.layers import quantization
from glowlm.platforms.host import live
from glowlm.platforms.interface import Match, Platform
from glowlm.platforms.selection import gather_candidates
from glowlm.plugins.manager import load_plugins
from glowlm.testing import contract, hosts

#: The recorded host (and assumed modules) a platform is built for when it misses here.
RECORDED = {"arm": ("aarch64-graviton3-neoverse-v1", ()), "apple": ("arm64-apple-m2", ()),
            "s390x": ("s390x-z15", ()), "zen": ("x86_64-zen4-epyc-9r14", ("zentorch",)),
            "x86": ("x86_64-icelake-xeon-8375c", ())}


def _platforms() -> list[tuple[str, Platform | None, str]]:
    out = []
    here = live()
    for cand in gather_candidates(load_plugins(envs.get().plugins_block), here):
        if cand.cls is None:
            continue
        host = here if cand.matched else None
        if host is None and cand.name in RECORDED:
            name, modules = RECORDED[cand.name]
            host = hosts.load(name, modules)
        if host is None:
            out.append((cand.name, None, f"{cand.name} matches neither this host nor a "
                                         "recorded one"))
            continue
        match = cand.cls.detect(host)
        assert match.matched, f"{cand.name} on {host.source}: {match.reason}"
        out.append((cand.name, cand.cls(host, Match(True, match.reason, match.isa)), ""))
    return out


PLATFORMS = _platforms()
DTYPE_CASES = [pytest.param(p, d, id=f"{name}-{contract.case_id(d)}")
               for name, p, _ in PLATFORMS if p is not None for d in p.capabilities.dtypes]


def test_every_installed_first_party_platform_is_covered() -> None:
    names = {name for name, p, _ in PLATFORMS if p is not None}
    assert {"generic", "x86", "zen", "arm", "s390x", "apple"} <= names, PLATFORMS


@pytest.mark.parametrize("platform, dtype", DTYPE_CASES)
def test_each_advertised_dtype_runs_a_tiny_model(platform: Platform, dtype: torch.dtype
                                                 ) -> None:
    contract.check_model(platform, dtype)


@pytest.mark.parametrize("platform", [pytest.param(p, id=n) for n, p, _ in PLATFORMS
                                      if p is not None])
def test_each_advertised_quantization_method_is_implemented(platform: Platform) -> None:
    done = quantization.implemented(platform)
    missing = [m for m in platform.capabilities.quantization if m not in done]
    assert not missing, (f"the {platform.name} platform advertises {missing} but no installed "
                         f"plugin implements them for it (implemented: {done})")


QUANT = Path(__file__).parent / "fixtures" / "quant"  # tiny llm-compressor checkpoints


def _quant_checkpoints() -> dict[str, Path]:
    """``quant_method -> one tiny checkpoint`` of the ones recorded in fixtures/quant."""
    out: dict[str, Path] = {}
    for d in sorted(QUANT.iterdir()) if QUANT.is_dir() else []:
        method = json.loads((d / "config.json").read_text()).get(
            "quantization_config", {}).get("quant_method")
        out.setdefault(method, d)
    return out


QUANT_CASES = [pytest.param(p, m, id=f"{n}-{m}") for n, p, _ in PLATFORMS if p is not None
               for m in p.capabilities.quantization if m in _quant_checkpoints()]


@pytest.mark.parametrize("platform, method", QUANT_CASES)
def test_each_advertised_quantization_method_runs_a_tiny_checkpoint(platform: Platform,
                                                                    method: str) -> None:
    # The checkpoint's prompt log-probabilities against transformers' (reference.json,
    # recorded with the checkpoint); 0.1 nats covers dynamic int8 activations, which
    # round differently from transformers' fake-quantized path.
    from glowlm import LLM, SamplingParams
    from glowlm.platforms import use_platform
    from glowlm.testing.tiny_models import SMALL_ENGINE

    path = _quant_checkpoints()[method]
    ref = json.loads((path / "reference.json").read_text())
    with use_platform(platform):
        llm = LLM(str(path), platform=platform.name, **SMALL_ENGINE)
        outs = llm.generate([{"prompt_token_ids": p} for p in ref["prompts"]],
                            SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=0,
                                           ignore_eos=True), use_tqdm=False)
        del llm
    for out, want in zip(outs, ref["prompt_logprobs"], strict=True):
        got = [next(iter(p.values())).logprob for p in out.prompt_logprobs[1:]]
        err = max(abs(a - b) for a, b in zip(got, want, strict=True))
        assert err < 0.1, f"{platform.name} {method} ({path.name}): max |d logprob| {err:.3g}"


GGUF_CASES = [pytest.param(p, id=n) for n, p, _ in PLATFORMS
              if p is not None and "gguf" in p.capabilities.quantization]


@pytest.mark.parametrize("platform", GGUF_CASES)
def test_advertised_gguf_runs_native_blocks(platform: Platform, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # gguf has no checkpoint config: a tiny Q4_1 file (llama.cpp's layout) runs with its
    # blocks native on the platform and must give the dequantized reference path's tokens
    # and prompt log-probabilities (both float32, the same block values).
    from glowlm import LLM, SamplingParams
    from glowlm.layers.quantization.gguf import GGUFLinearMethod
    from glowlm.platforms import use_platform
    from glowlm.testing.tiny_gguf import write_tiny_gguf
    from glowlm.testing.tiny_models import SMALL_ENGINE, make_tiny_model

    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    monkeypatch.setenv("GLOWLM_GGUF_INT8_ACTIVATIONS", "0")  # the same block values exactly
    path = write_tiny_gguf(make_tiny_model("mistral", tmp_path / "hf"), tmp_path / "m.gguf",
                           "Q4_1")
    prompts = [{"prompt_token_ids": [5, 6, 7, 8, 9, 10, 11]}, {"prompt_token_ids": [40] * 20}]
    params = SamplingParams(max_tokens=4, temperature=0, prompt_logprobs=0, ignore_eos=True)

    def run(name: str) -> list:
        llm = LLM(str(path), platform=name, dtype="float32", **SMALL_ENGINE)
        layer = llm.engine.runner.model.model.layers[0].self_attn.qkv_proj
        native = isinstance(layer.method, GGUFLinearMethod)
        outs = llm.generate(prompts, params, use_tqdm=False)
        del llm
        return [native, *outs]

    want = run("generic")  # GLOWLM_GGUF_NATIVE unset: dequantized at load
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE", "1")
    with use_platform(platform):
        got = run(platform.name)
    assert got[0] and not want[0]
    for a, b in zip(got[1:], want[1:], strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        la = [next(iter(p.values())).logprob for p in a.prompt_logprobs[1:]]
        lb = [next(iter(p.values())).logprob for p in b.prompt_logprobs[1:]]
        assert max(abs(x - y) for x, y in zip(la, lb, strict=True)) < 1e-4
