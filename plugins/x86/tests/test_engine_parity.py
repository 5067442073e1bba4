"""The whole engine with the compiled x86 kernels against reference kernels and transformers.

Greedy tokens must be identical on every tiny architecture (fp32): x86 (compiled
norms, rotary, activations, GEMV/GEMM and paged attention) vs the generic
platform (core's reference parts) vs transformers. Prompt lengths cover partial
blocks, several blocks, and a chunked prefill.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.plugin_api import REFERENCE_OPS
from glowlm.plugin_api import live_host as live
from glowlm.testing.pruning import assert_pruned_prefill_matches
from glowlm.testing.tiny_models import ARCHITECTURES, VOCAB, make_tiny_model
from glowlm_x86.kernels.linear import X86LinearMethod
from glowlm_x86.kernels.ops import OP_NAMES
from glowlm_x86.kernels.testing import require_kernels
from glowlm_x86.platform import X86Platform, installed_kernels

PROMPT_LENS = (5, 23, 70, 41)
MAX_TOKENS = 12
ENGINE = dict(kv_cache_space_gib=0.05, block_size=32, show_progress=False, dtype="float32",
              max_model_len=128)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {}


def _model(model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory,
           arch: str) -> Path:
    if arch not in model_dirs:
        model_dirs[arch] = make_tiny_model(arch, tmp_path_factory.mktemp(f"x86-{arch}"))
    return model_dirs[arch]


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 384, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _greedy(model_dir: Path, platform: str, **extra: object) -> list[list[int]]:
    llm = LLM(str(model_dir), platform=platform, **ENGINE, **extra)  # type: ignore[arg-type]
    outs = llm.generate([{"prompt_token_ids": p} for p in _prompts()],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _hf_greedy(model_dir: Path) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    for p in _prompts():
        ids = hf.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False,
                          eos_token_id=None, pad_token_id=1)
        outs.append(ids[0, len(p):].tolist())
    return outs


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_x86_kernels_match_reference_and_transformers(
        arch: str, model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    require_kernels()
    model_dir = _model(model_dirs, tmp_path_factory, arch)
    compiled = _greedy(model_dir, "x86")
    assert compiled == _greedy(model_dir, "generic")
    assert compiled == _hf_greedy(model_dir)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_pruned_prefill_with_compiled_kernels(model_dirs: dict[str, Path],
                                              tmp_path_factory: pytest.TempPathFactory,
                                              arch: str) -> None:
    """The decoder stack without its last layer, then that layer on the sampled rows."""
    require_kernels()
    assert_pruned_prefill_matches(_model(model_dirs, tmp_path_factory, arch), "x86", VOCAB,
                                  **ENGINE)


def test_chunked_prefill_with_compiled_kernels(model_dirs: dict[str, Path],
                                               tmp_path_factory: pytest.TempPathFactory
                                               ) -> None:
    require_kernels()
    model_dir = _model(model_dirs, tmp_path_factory, "llama")
    assert _greedy(model_dir, "x86", max_num_batched_tokens=16) == _hf_greedy(model_dir)


def _live_x86() -> X86Platform:
    cpu = live()
    match = X86Platform.detect(cpu)
    if not match.matched:
        pytest.skip(match.reason)
    return X86Platform(cpu, match)


def test_platform_names_the_kernels_that_loaded() -> None:
    require_kernels()
    platform = _live_x86()
    # Nothing is loaded before an engine asks; the installed modules are listed already.
    assert platform.capabilities.kernels in ((), OP_NAMES)
    assert bool(platform.capabilities.kernels) == bool(installed_kernels(platform.capabilities.isa))
    assert platform.ops().replaced() == ["rms_norm", "fused_add_rms_norm", "layer_norm",
                                         "rotary_embedding", "silu_and_mul", "gelu",
                                         "gelu_tanh", "relu", "dense_linear", "fused_moe",
                                         "lora_shrink_expand",
                                         "ln_decoder_layer",
                                         "rms_decoder_layer", "ln_decoder_stack",
                                         "rms_decoder_stack", "decoder_layer", "decoder_stack",
                                         "shm_all_reduce"]
    assert platform.capabilities.kernels == OP_NAMES
    assert platform.attention_backend().name == "x86"
    assert isinstance(platform.unquantized_linear_method(), X86LinearMethod)


def test_disable_kernels_gives_the_reference_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWLM_DISABLE_KERNELS", "1")
    platform = _live_x86()
    assert platform.ops() is REFERENCE_OPS
    assert platform.attention_backend().name == "reference"
    assert platform.capabilities.kernels == ()


def test_an_install_without_modules_lists_no_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """``glowlm platforms`` must not name kernels from the CPU alone: with no module
    installed for the ISA family the list is empty and a start-up note says why."""
    import glowlm_x86.platform as x86_platform

    monkeypatch.setattr(x86_platform, "FAMILY_MODULES", {"avx2": (), "avx512": ()})
    cpu = live()
    match = X86Platform.detect(cpu)
    if not match.matched:
        pytest.skip(match.reason)
    platform = X86Platform(cpu, match)
    assert platform.capabilities.kernels == ()
    assert any(n.startswith("glowlm-x86: kernels not built") for n in platform.startup_notes())
