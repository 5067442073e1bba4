"""Per-request logit processors: ``logit_bias``, ``allowed_token_ids``, ``bad_words``,
structured outputs.

Two halves. :func:`prepare_params` runs once per request when it is added
(tokenize the bad words, check token ids against the vocabulary, attach the
grammar engine). :func:`add_processors` runs once per step over the rows the
sampler will see and fills :class:`~glowlm.sampling.sampler.SamplingBatch`
with, at most, one sparse bias (row, token, value) list and one ``[R, vocab]``
"blocked" mask. Rows without any of these cost nothing but one attribute test,
and a batch where no row uses them gets neither tensor, so ordinary requests
batched with constrained ones sample exactly as they would alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from glowlm.sampling.params import SamplingParams

#: One grammar engine per tokenizer (building llguidance's tokenizer takes ~1 s);
#: the tokenizer is held so its id cannot be reused while the entry exists.
_GRAMMAR_ENGINES: dict[int, tuple[Any, Any]] = {}


def grammar_engine(tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> Any:
    from glowlm.sampling.structured import GrammarEngine

    entry = _GRAMMAR_ENGINES.get(id(tokenizer))
    if entry is None or entry[0] is not tokenizer:
        entry = (tokenizer, GrammarEngine(tokenizer, vocab_size, sorted(eos_token_ids)))
        _GRAMMAR_ENGINES[id(tokenizer)] = entry
    return entry[1]


def bad_words_token_ids(words: Sequence[str], tokenizer: Any) -> list[list[int]]:
    """Each word as token ids, alone and after a space (how it appears mid-text), as vLLM."""
    out: list[list[int]] = []
    for word in words:
        for prefix in ("", " "):
            ids = list(tokenizer.encode(prefix + word.lstrip(), add_special_tokens=False))
            if ids and ids not in out:
                out.append(ids)
    return out


def prepare_params(params: SamplingParams, tokenizer: Any, vocab_size: int,
                   eos_token_ids: Sequence[int]) -> None:
    """Resolve what needs the tokenizer; raises RequestError before anything is queued."""
    params.check_vocab(vocab_size)
    if params.bad_words:
        params.bad_words_token_ids = bad_words_token_ids(params.bad_words, tokenizer)
    spec = params.structured_outputs
    if spec is not None:
        from glowlm.sampling.structured import grammar_of

        if spec.compiled is None:
            spec.compiled = grammar_of(spec)
        spec.engine = grammar_engine(tokenizer, vocab_size, eos_token_ids)


def truncate_prompt(token_ids: list[int], params: SamplingParams, max_model_len: int
                    ) -> list[int]:
    """The prompt's last ``truncate_prompt_tokens`` tokens (-1: what the context holds)."""
    k = params.truncate_prompt_tokens
    if k is None:
        return token_ids
    keep = max_model_len - 1 if k == -1 else k
    return token_ids[-keep:] if len(token_ids) > keep else token_ids


def _banned_by_bad_words(words: list[list[int]], output: list[int]) -> list[int]:
    banned = []
    for ids in words:
        head = ids[:-1]
        if not head or (len(output) >= len(head) and output[len(output) - len(head):] == head):
            banned.append(ids[-1])
    return banned


def add_processors(batch: Any, rows: Sequence[Any], params: Sequence[SamplingParams],
                   vocab: int) -> None:
    """Fill ``batch.bias_*`` and ``batch.blocked`` for the rows whose request asks."""
    active = [i for i, p in enumerate(params) if p.needs_processors]
    if not active:
        return
    bias_rows: list[int] = []
    bias_ids: list[int] = []
    bias_values: list[float] = []
    blocked: torch.Tensor | None = None

    def block_row(i: int) -> torch.Tensor:
        nonlocal blocked
        if blocked is None:
            blocked = torch.zeros(len(rows), vocab, dtype=torch.bool)
        return blocked[i]

    grammar_rows: dict[int, list[int]] = {}  # id(engine) -> rows
    engines: dict[int, Any] = {}
    for i in active:
        p, seq = params[i], rows[i]
        if p.logit_bias:
            for tid, value in p.logit_bias.items():
                if tid < vocab:
                    bias_rows.append(i)
                    bias_ids.append(tid)
                    bias_values.append(value)
        if p.allowed_token_ids is not None:
            row = block_row(i)
            row.fill_(True)
            row[torch.tensor([t for t in p.allowed_token_ids if t < vocab],
                             dtype=torch.long)] = False
        if p.bad_words_token_ids:
            banned = _banned_by_bad_words(p.bad_words_token_ids, seq.output_token_ids)
            if banned:
                block_row(i)[torch.tensor(banned, dtype=torch.long)] = True
        spec = p.structured_outputs
        if spec is not None and spec.engine is not None:
            engines[id(spec.engine)] = spec.engine
            grammar_rows.setdefault(id(spec.engine), []).append(i)
    for key, idx in grammar_rows.items():
        from glowlm.sampling.structured import bitmask_to_bool

        engine = engines[key]
        bitmask = torch.full((len(idx), engine.words), -1, dtype=torch.int32)
        engine.fill_bitmask([rows[i] for i in idx],
                            [params[i].structured_outputs for i in idx], bitmask)
        allowed = bitmask_to_bool(bitmask, vocab)
        index = torch.from_numpy(np.asarray(idx, dtype=np.int64))
        if blocked is None:
            blocked = torch.zeros(len(rows), vocab, dtype=torch.bool)
        blocked[index] |= ~allowed
    if bias_rows:
        batch.bias_rows = torch.tensor(bias_rows, dtype=torch.long)
        batch.bias_ids = torch.tensor(bias_ids, dtype=torch.long)
        batch.bias_values = torch.tensor(bias_values, dtype=torch.float32)
    batch.blocked = blocked
