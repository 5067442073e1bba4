"""Sliding windows that slide: blocks behind every layer's window go back to the pool.

A tiny Mistral with a 40-token window on 32-token blocks runs far past the window and
past what its KV pool could hold without sliding; greedy tokens must be transformers'
(whose mask hides keys ``p <= q - window``), with the compiled-or-generic fused layer
op running only in steps within the window. Qwen2 with ``max_window_layers`` mixes
full and sliding layers, so nothing is given back there, and its windows still shape
the tokens as transformers'.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.engine.block_manager import NO_BLOCK, BlockManager
from glowlm.engine.sequence import Request, Sequence
from glowlm.testing.tiny_models import VOCAB, make_tiny_model

WINDOW, BLOCK = 40, 32
ENGINE = dict(platform="generic", block_size=BLOCK, show_progress=False)


def _prompts(*lengths: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _transformers_greedy(model_dir: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return [hf.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False,
                        eos_token_id=None, pad_token_id=1)[0, len(p):].tolist()
            for p in prompts]


def _greedy(llm: LLM, prompts: list[list[int]], n: int) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
                        use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("mistral", tmp_path_factory.mktemp("m") / "mistral",
                           sliding_window=WINDOW)


def test_long_sequences_run_in_the_windows_blocks(mistral: Path) -> None:
    """Six blocks hold 192 tokens; two sequences of 340 tokens each run through them,
    token for token transformers', and every block is back in the pool at the end."""
    prompts = _prompts(40, 57)
    want = _transformers_greedy(mistral, prompts, 300)
    llm = LLM(str(mistral), max_model_len=512, num_kv_blocks=6, max_num_batched_tokens=32,
              **ENGINE)
    bm = llm.engine.block_manager
    assert bm.window == WINDOW and llm.engine.config.max_model_len == 512
    layers = llm.engine.runner.model.model.own
    assert all(la.self_attn.attn.spec.sliding_window == WINDOW for la in layers)
    assert all(la.fused.window == WINDOW for la in layers)
    assert _greedy(llm, prompts, 300) == want
    assert bm.num_slid_blocks >= 2 * (340 - 192) // BLOCK
    assert bm.num_free_blocks == 6


@pytest.mark.parametrize("budget", [4096, 16], ids=["plain", "chunked-prefill"])
def test_greedy_past_the_window_matches_transformers(mistral: Path, budget: int) -> None:
    prompts = _prompts(5, 30, 70)
    want = _transformers_greedy(mistral, prompts, 40)
    llm = LLM(str(mistral), max_model_len=256, kv_cache_space_gib=0.02,
              max_num_batched_tokens=budget, **ENGINE)
    assert _greedy(llm, prompts, 40) == want


def test_a_cached_prefix_longer_than_the_window(mistral: Path) -> None:
    """The second request finds the first's prompt blocks in the cache (given back but
    not yet evicted) and decodes the same tokens."""
    prompt = _prompts(100)
    llm = LLM(str(mistral), max_model_len=256, kv_cache_space_gib=0.02, **ENGINE)
    first = _greedy(llm, prompt, 20)
    second = _greedy(llm, prompt, 20)
    assert first == second == _transformers_greedy(mistral, prompt, 20)
    assert llm.engine.block_manager.stats.hits >= 96


def test_no_window_keeps_every_block(tmp_path: Path) -> None:
    llm = LLM(str(make_tiny_model("mistral", tmp_path / "m")), max_model_len=256,
              kv_cache_space_gib=0.02, **ENGINE)
    assert llm.engine.block_manager.window is None
    _greedy(llm, _prompts(90), 10)
    assert llm.engine.block_manager.num_slid_blocks == 0


def test_mixed_full_and_sliding_layers_keep_their_blocks(tmp_path: Path) -> None:
    """Qwen2's first ``max_window_layers`` layers attend to everything: no block goes
    back, and the sliding layer still shapes the tokens as in transformers."""
    # layer_types as transformers derives them from the two fields (the tiny writer
    # sets fields after the config is built, so it would not rederive them).
    model = make_tiny_model("qwen2", tmp_path / "q", use_sliding_window=True,
                            sliding_window=WINDOW, max_window_layers=1,
                            layer_types=["full_attention", "sliding_attention"])
    llm = LLM(str(model), max_model_len=256, kv_cache_space_gib=0.02, **ENGINE)
    layers = llm.engine.runner.model.model.own
    assert [la.self_attn.attn.spec.sliding_window for la in layers] == [None, WINDOW]
    assert llm.engine.block_manager.window is None
    prompts = _prompts(70, 33)
    assert _greedy(llm, prompts, 30) == _transformers_greedy(model, prompts, 30)
    assert llm.engine.block_manager.num_slid_blocks == 0


def _seq(sid: int, tokens: list[int]) -> Sequence:
    from glowlm import SamplingParams as P

    req = Request(str(sid), None, tokens, P(), 4, frozenset(), 0)
    return Sequence(sid, req, 0, list(tokens), len(tokens))


def test_slide_gives_back_only_what_no_query_sees() -> None:
    bm = BlockManager(8, 4, enable_prefix_caching=True, window=6)
    seq = _seq(1, list(range(3, 23)))  # 20 tokens = 5 blocks
    bm.grow(seq, 20)
    seq.num_computed_tokens = 20
    bm.cache_computed_blocks(seq)
    # The next query (position 20) sees keys 15..20: blocks 0-2 (positions 0-11) are
    # dead, block 3 (12-15) is not.
    assert bm.slide(seq) == 3
    assert seq.block_table[:3] == [NO_BLOCK] * 3 and NO_BLOCK not in seq.block_table[3:]
    assert bm.num_free_blocks == 6 and bm.slide(seq) == 0
    child = _seq(2, list(seq.token_ids))
    bm.fork(seq, child)
    assert bm.ref_counts[seq.block_table[3]] == 2
    bm.free_seq(seq)
    assert bm.num_free_blocks == 6  # the child still holds blocks 3 and 4
    bm.free_seq(child)
    assert bm.num_free_blocks == 8 and all(c == 0 for c in bm.ref_counts)
    # The given-back blocks stay in the prefix cache until evicted.
    again = _seq(3, list(range(3, 23)) + [5])
    assert bm.match_prefix(again) == 20


def test_qwen2_rule_without_layer_types() -> None:
    """Configs written before ``layer_types`` (or built by the GGUF reader)."""
    from types import SimpleNamespace

    from glowlm.models.spec import FULL, SLIDING, windowed_layers

    base = dict(num_hidden_layers=3, sliding_window=WINDOW, max_window_layers=1)
    assert windowed_layers(SimpleNamespace(**base, use_sliding_window=True)) == [
        FULL, SLIDING, SLIDING]
    assert windowed_layers(SimpleNamespace(**base, use_sliding_window=False)) == [FULL] * 3
