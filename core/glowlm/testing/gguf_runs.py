"""Running a GGUF file on the host's own platform, for the native-block tests.

Shared by the dense and the mixture-of-experts GGUF tests (core/tests/test_gguf_native*.py):
the platform whose GGUF kernels run the blocks natively, a greedy run with prompt
log-probabilities over fixed prompts, and the comparison both sets of tests make.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from glowlm import LLM, SamplingParams

#: A small engine: tiny models need a few blocks, not a share of the machine.
SMALL: dict[str, Any] = dict(kv_cache_space_gib=0.02, block_size=32, show_progress=False)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(20, 60)), [300, 12, 99, 4, 250] * 5]


def host_platform() -> Any:
    """The platform this host selects (blocked plugins honoured)."""
    from glowlm import envs
    from glowlm.platforms import host, select_platform

    return select_platform(host.live(), None, envs.get().plugins_block).platform


def native_gguf_platform() -> str | None:
    """The host platform's name if it runs GGUF blocks natively, else None."""
    from glowlm.layers.quantization import implemented

    platform = host_platform()
    return platform.name if "gguf" in implemented(platform) else None


def host_gguf_kernels() -> Any:
    """The GGUF kernel set of the host's own platform."""
    from glowlm.layers import quantization

    return quantization.resolve({"quant_method": "gguf", "layers": {}},
                                host_platform()).kernels()


def run_greedy(path: Path, platform: str, **kw: object) -> tuple[LLM, list]:
    """8 greedy tokens and prompt log-probabilities for each of :data:`PROMPTS`, fp32."""
    llm = LLM(str(path), dtype="float32", platform=platform, **SMALL, **kw)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=0)
    return llm, llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                             use_tqdm=False)


def assert_same(got: list, want: list, atol: float = 1e-4) -> None:
    """The same greedy tokens, and prompt log-probabilities within ``atol``."""
    for a, b in zip(got, want, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        la = torch.tensor([next(iter(p.values())).logprob for p in a.prompt_logprobs[1:]])
        lb = torch.tensor([next(iter(p.values())).logprob for p in b.prompt_logprobs[1:]])
        torch.testing.assert_close(la, lb, rtol=0, atol=atol)
