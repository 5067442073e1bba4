"""A check any platform's tests can run: pruned prefill equals the whole last layer.

The runner asks models for the hidden states of the sampled rows only
(:meth:`glowlm.models.base.CausalLM.forward`'s ``output_rows``), so prefill runs the
last layer's MLP on those rows alone. This generates twice on one engine, pruned and
not, and asserts the same tokens and log-probabilities.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from glowlm import LLM, SamplingParams


def assert_pruned_prefill_matches(model_dir: str | Path, platform: str, vocab: int,
                                  **engine: Any) -> None:
    """A 16-token budget makes chunks that sample nothing (zero rows kept); prompt
    log-probabilities ask for rows in another order than the tokens'. Tolerance 1e-4:
    the MLP then runs on 1 row instead of up to 16, so GEMM and GEMV sum in other
    orders (fp32 rounding, ~1e-6 on these tiny models)."""
    g = torch.Generator().manual_seed(2)
    prompts = [{"prompt_token_ids": torch.randint(3, vocab, (n,), generator=g).tolist()}
               for n in (5, 23, 41)]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2,
                            prompt_logprobs=1)
    llm = LLM(str(model_dir), platform=platform, max_num_batched_tokens=16, **engine)
    runner = llm.engine.runner
    assert runner._prunes, "the model's forward does not take output_rows"
    pruned = llm.generate(prompts, params, use_tqdm=False)
    runner._prunes = False
    whole = llm.generate(prompts, params, use_tqdm=False)
    for a, b in zip(pruned, whole, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        steps = list(zip(a.outputs[0].logprobs or [], b.outputs[0].logprobs or [], strict=True))
        steps += list(zip((a.prompt_logprobs or [])[1:], (b.prompt_logprobs or [])[1:],
                          strict=True))
        assert steps
        for x, y in steps:
            assert x.keys() == y.keys()
            for tok in x:
                assert abs(x[tok].logprob - y[tok].logprob) < 1e-4, (tok, x, y)
