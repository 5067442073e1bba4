"""Structured outputs: a grammar the output must match, applied as a token mask.

The grammar engine is llguidance (one of the two vLLM uses): it compiles a JSON
schema, a regex, a choice list or a Lark/GBNF grammar against the tokenizer
and, at each step, fills a bitmask of the tokens that keep the output inside
the grammar. The sampler turns the bitmask into ``-inf`` logits for the rest,
on the constrained rows only, so constrained and ordinary requests share a batch.

State: one ``LLMatcher`` per sequence, created at the sequence's first sampled
step and advanced lazily: before computing a mask, the matcher consumes the
tokens the sequence gained since the last mask. So nothing runs after sampling,
preemption (which keeps the output) needs no rollback, and ``n`` completions
each get their own matcher. When the grammar is complete, the mask allows
only end-of-sequence.

Why llguidance rather than xgrammar: both install beside torch 2.13.0, but the
xgrammar wheel pulls in triton (a GPU compiler, ~150 MB) for nothing on CPU.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from glowlm.errors import RequestError
from glowlm.sampling.params import StructuredOutputsParams

#: JSON layout the model must write: compact (no free whitespace), as vLLM's
#: default for llguidance, so a model cannot spend its tokens on indentation.
_JSON_OPTIONS = {"whitespace_flexible": False}


def grammar_of(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar for ``spec``; raises RequestError naming what is wrong.

    Validity is checked here (without a tokenizer) so a bad schema or regex is a
    400 before anything is queued.
    """
    import llguidance

    try:
        if spec.json is not None:
            schema = json.loads(spec.json) if isinstance(spec.json, str) else spec.json
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                schema, defaults=_JSON_OPTIONS)  # type: ignore[arg-type]
            what = "json"
        elif spec.json_object:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                {"type": "object"}, defaults=_JSON_OPTIONS)  # type: ignore[arg-type]
            what = "json_object"
        elif spec.regex is not None:
            grammar, what = llguidance.LLMatcher.grammar_from_regex(spec.regex), "regex"
        elif spec.choice is not None:
            grammar = llguidance.grammar_from("choice", json.dumps(spec.choice))
            what = "choice"
        else:
            assert spec.grammar is not None
            grammar, what = llguidance.grammar_from("grammar", spec.grammar), "grammar"
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        raise RequestError(f"structured_outputs: invalid grammar: {exc}") from None
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error and not error.startswith("WARNING"):
        raise RequestError(f"structured_outputs.{what}: {error}")
    return grammar


class GrammarEngine:
    """Matchers for the sequences of one engine (one tokenizer, one vocabulary)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        import llguidance.hf

        eos = list(eos_token_ids) or None
        # The model's vocabulary may be padded beyond the tokenizer's: n_vocab covers it.
        self.ll_tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=vocab_size, eos_token=eos[0] if eos else None)
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        #: sequence -> (matcher, output tokens consumed); weak, so finished or aborted
        #: sequences drop their matcher with them.
        self._state: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()

    def _matcher(self, seq: Any, spec: StructuredOutputsParams) -> list[Any]:
        state = self._state.get(seq)
        if state is None:
            import llguidance

            if spec.compiled is None:  # n completions share the spec: compile once
                spec.compiled = grammar_of(spec)
            matcher = llguidance.LLMatcher(self.ll_tokenizer, spec.compiled, log_level=0)
            state = self._state[seq] = [matcher, 0]
        return state

    def fill_bitmask(self, seqs: Sequence[Any], specs: Sequence[StructuredOutputsParams],
                     out: torch.Tensor) -> None:
        """Row ``i`` of ``out`` (int32 ``[len(seqs), words]``) = allowed tokens of seq ``i``."""
        from llguidance.torch import fill_next_token_bitmask

        for i, (seq, spec) in enumerate(zip(seqs, specs, strict=True)):
            state = self._matcher(seq, spec)
            matcher, done = state
            new = seq.output_token_ids[done:]
            if new:
                matcher.consume_tokens(new)
                state[1] = done + len(new)
            if matcher.is_error():
                # Should not happen (the mask allowed every token); end it cleanly.
                words = [0] * self.words
                for t in seq.request.eos_token_ids:
                    words[t // 32] |= 1 << (t % 32)
                out[i] = torch.from_numpy(np.array(words, dtype=np.uint32).view(np.int32))
                continue
            fill_next_token_bitmask(matcher, out, i)


def bitmask_to_bool(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[R, words]`` int32 bitmask (bit j of word w = token 32w + j) -> ``[R, vocab]`` bool.

    numpy's unpackbits, not a torch shift-and-compare: one pass over R x vocab/8
    bytes (~10 us for a 32000-token row).
    """
    raw = bitmask.numpy().view(np.uint8)
    bits = np.unpackbits(raw, axis=1, bitorder="little")[:, :vocab_size]
    return torch.from_numpy(bits.view(np.bool_))
