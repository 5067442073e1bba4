"""Prefix caching: shared prefixes are computed once, outputs do not change."""

from __future__ import annotations

import torch
from glowlm import LLM, SamplingParams
from glowlm.engine.block_manager import BlockManager
from glowlm.engine.sequence import Request, Sequence
from glowlm.testing.tiny_models import SMALL_ENGINE


def _batch(prefix_len: int = 512, n: int = 16) -> list[dict]:
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(3, 384, (prefix_len,), generator=g).tolist()
    return [{"prompt_token_ids": prefix + torch.randint(3, 384, (5 + i,), generator=g).tolist()}
            for i in range(n)]


def test_shared_prefix_is_computed_once_and_output_unchanged(tiny_model_dir):
    model = str(tiny_model_dir("llama"))
    prompts = _batch()
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    settings = dict(platform="generic", max_model_len=1024,
                    **{**SMALL_ENGINE, "kv_cache_space_gib": 0.05})
    cached = LLM(model, **settings)
    out_cached = cached.generate(prompts, params, use_tqdm=False)
    plain = LLM(model, enable_prefix_caching=False, **settings)
    out_plain = plain.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out_cached] == \
        [o.outputs[0].token_ids for o in out_plain]
    suffixes = sum(len(p["prompt_token_ids"]) - 512 for p in prompts)
    # Caching on: the 512-token prefix is computed once; off: sixteen times.
    assert cached.engine.stats.prompt_tokens == 512 + suffixes
    assert plain.engine.stats.prompt_tokens == 16 * 512 + suffixes
    stats = cached.engine.block_manager.stats
    assert stats.hits == 15 * 512 and stats.hit_rate > 0.8
    assert sum(o.num_cached_tokens for o in out_cached) == 15 * 512



def test_prompt_logprobs_are_complete_when_the_prefix_is_cached(tiny_model_dir):
    """The cache holds keys and values, not logits: a request that asks for prompt
    log-probabilities computes its whole prompt, even when the prefix is cached."""
    llm = LLM(str(tiny_model_dir("llama")), platform="generic", max_model_len=256,
              **SMALL_ENGINE)
    prompt = {"prompt_token_ids": list(range(3, 103))}
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    first, second = (llm.generate(prompt, params, use_tqdm=False)[0] for _ in range(2))
    assert len(first.prompt_logprobs) == len(second.prompt_logprobs) == 100
    assert [p and sorted(p) for p in first.prompt_logprobs] == \
        [p and sorted(p) for p in second.prompt_logprobs]
    plain = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1),
                         use_tqdm=False)[0]
    assert plain.num_cached_tokens == 96  # the prefix cache still serves the others

def _seq(tokens: list[int], sid: int = 1) -> Sequence:
    from glowlm.sampling.params import SamplingParams as P

    req = Request(str(sid), None, tokens, P(), 4, frozenset(), 0)
    seq = Sequence(sid, req, 0, list(tokens), len(tokens))
    req.seqs.append(seq)
    return seq


def test_freed_blocks_stay_cached_and_are_evicted_lru():
    bm = BlockManager(num_blocks=4, block_size=32, enable_prefix_caching=True)
    a = _seq(list(range(65)))
    assert bm.match_prefix(a) == 0
    bm.grow(a, 65)
    a.num_computed_tokens = 65
    bm.cache_computed_blocks(a)
    bm.free_seq(a)
    assert bm.num_free_blocks == 4 and len(bm.cached) == 2
    b = _seq(list(range(65)), sid=2)
    assert bm.match_prefix(b) == 64  # both full blocks hit
    bm.free_seq(b)
    # Fill the cache with unrelated blocks: the deepest cached block is evicted first.
    c = _seq(list(range(1000, 1097)), sid=3)
    bm.match_prefix(c)
    bm.grow(c, 97)  # 4 blocks: takes the uncached one, then evicts cached ones
    assert len(bm.cached) == 0
    bm.free_seq(c)


def test_copy_on_write_unshares_a_partial_block():
    bm = BlockManager(num_blocks=8, block_size=32, enable_prefix_caching=False)
    parent = _seq(list(range(40)))
    bm.grow(parent, 40)
    child = _seq(list(range(40)), sid=2)
    bm.fork(parent, child)
    assert bm.ref_counts[parent.block_table[1]] == 2
    src, dst = bm.copy_on_write(child, 40)
    assert src == parent.block_table[1] and child.block_table[1] == dst and src != dst
    assert bm.copy_on_write(parent, 40) is None  # the parent now owns its block alone
