"""Gemma 3 with the compiled x86 kernels against core's reference parts and transformers.

The tiny Gemma 3 (glowlm.testing.tiny_models: 12-token window, local and global
layers) runs its modules (no fused layer covers its shape) on the x86 norms, rotary,
GEMV/GEMM and paged attention; its local layers run the plain kernel while a step's
sequences fit the window and the windowed kernel after. fp32 greedy tokens must
equal the generic platform's and transformers', whole and in 16-token chunks; the
bf16 prompt log-probabilities agree with transformers' within 0.125 (two bf16 ulps
of a logit in [8, 16), the bound core/tests/test_gemma3.py explains).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.testing.pruning import assert_pruned_prefill_matches
from glowlm.testing.tiny_models import VOCAB, make_tiny_model
from glowlm_x86.kernels.testing import require_kernels

PROMPT_LENS = (5, 11, 23, 70, 41)
MAX_TOKENS = 12
ENGINE = dict(kv_cache_space_gib=0.05, block_size=32, show_progress=False, max_model_len=128)


@pytest.fixture(autouse=True)
def kernels() -> None:
    require_kernels()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("gemma3", tmp_path_factory.mktemp("x86-gemma3"))


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _greedy(model_dir: Path, platform: str, **extra: object) -> list[list[int]]:
    llm = LLM(str(model_dir), platform=platform, dtype="float32", **ENGINE,  # type: ignore[arg-type]
              **extra)
    outs = llm.generate([{"prompt_token_ids": p} for p in _prompts()],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _hf(model_dir: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()


def test_x86_matches_reference_and_transformers(model_dir: Path) -> None:
    hf = _hf(model_dir, torch.float32)
    expected = [hf.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False,
                            eos_token_id=None, pad_token_id=1)[0, len(p):].tolist()
                for p in _prompts()]
    compiled = _greedy(model_dir, "x86")
    assert compiled == expected
    assert _greedy(model_dir, "x86", max_num_batched_tokens=16) == expected
    assert _greedy(model_dir, "generic", max_num_batched_tokens=16) == expected


def test_bf16_prompt_logprobs_match_transformers(model_dir: Path) -> None:
    prompt = _prompts()[3]
    with torch.no_grad():
        logits = _hf(model_dir, torch.bfloat16)(torch.tensor([prompt])).logits[0]
    assert logits.abs().max() < 16
    want = logits.float().log_softmax(-1)[torch.arange(len(prompt) - 1),
                                           torch.tensor(prompt[1:])]
    llm = LLM(str(model_dir), platform="x86", dtype="bfloat16", max_num_batched_tokens=16,
              **ENGINE)  # type: ignore[arg-type]
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0),
                       use_tqdm=False)[0]
    got = torch.tensor([out.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))])
    torch.testing.assert_close(got, want, atol=0.125, rtol=0)


def test_pruned_prefill_with_compiled_kernels(model_dir: Path) -> None:
    assert_pruned_prefill_matches(model_dir, "x86", VOCAB, dtype="float32", **ENGINE)
