"""Beam search over the engine: vLLM's ``LLM.beam_search`` and the server's ``use_beam_search``.

The search runs above the engine, one expansion step at a time. Every live
hypothesis (beam) of every prompt becomes one engine request of the whole
token sequence so far with ``max_tokens=1`` and ``logprobs=2 * beam_width``;
all of a step's requests run as one batch. Their top tokens are the
candidates. The engine's prefix cache makes each such request read the full KV
blocks that the prompt and the beam's earlier steps already computed (the
shared prompt is computed once for all beams; only the tail past the last full
block is recomputed), so the engine itself needs no beam-specific state.

The selection rule is transformers' (``generate(num_beams=W, do_sample=False)``),
which keeps the search exact with respect to the beam it reports:

* the candidates of all beams of a prompt are ranked by cumulative log-probability;
* among the best ``W``, an EOS candidate (unless ``ignore_eos``) becomes a finished
  hypothesis; on the last step (``max_tokens`` generated) all of the best ``W`` do;
* the best ``W`` candidates that did not finish are the next step's beams;
* finished hypotheses rank by ``cum_logprob / len ** length_penalty``, ``len`` the
  generated tokens with the EOS (transformers' ``BeamSearchScorer`` normalisation).

vLLM keeps every EOS candidate of a step, also those outside the best ``W``;
transformers (and glowlm) only let a hypothesis finish from inside the beam.
The search stops before ``max_tokens`` only when ``W`` hypotheses have finished
and no live beam can still beat the worst of them: log-probabilities are never
positive, so a beam's score is bounded by its score now, normalised by the
most favourable length it could still reach. That bound is exact, so stopping
early never changes the result (it is transformers' ``early_stopping="never"``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from glowlm.engine.outputs import PositionLogprobs, RequestOutput
from glowlm.errors import RequestError
from glowlm.sampling.params import BeamSearchParams, SamplingParams


@dataclass
class BeamSearchSequence:
    """One returned hypothesis, as vLLM's: ``tokens`` are the prompt's and the generated
    ones; ``text`` the generated text; ``logprobs`` one entry per generated token (its
    ``2 * beam_width`` candidates, the chosen token among them), the EOS included."""

    tokens: list[int]
    logprobs: list[PositionLogprobs]
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None   # "stop" (EOS) | "length" (max_tokens)
    stop_reason: int | None = None     # the EOS token id that ended it
    score: float = 0.0                 # cum_logprob / len ** length_penalty (the ranking)


@dataclass
class BeamSearchOutput:
    """The best ``beam_width`` hypotheses of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def beam_score(cum_logprob: float, length: int, length_penalty: float) -> float:
    """The final ranking of a hypothesis with ``length`` generated tokens.

    Any finite ``length_penalty`` is accepted (vLLM bounds none), so ``len ** lp`` may
    leave the float range: past it the score is the limit, not an OverflowError.
    """
    try:
        factor = max(length, 1) ** length_penalty
    except OverflowError:
        factor = math.inf
    if factor == 0.0:
        return -math.inf if cum_logprob < 0 else 0.0
    return cum_logprob / factor


def check_beam_width(params: BeamSearchParams, vocab_size: int) -> None:
    """Every beam needs ``2 * beam_width`` distinct candidate tokens."""
    if 2 * params.beam_width > vocab_size:
        raise RequestError(f"beam_width={params.beam_width} needs 2 * beam_width candidate "
                           f"tokens per beam, more than the vocabulary has ({vocab_size})")


def expansion_params(params: BeamSearchParams) -> SamplingParams:
    """The engine request behind one beam's step: one token, its ``2 * W`` candidates.

    EOS is the search's business, not the engine's (``ignore_eos``); with
    ``temperature > 0`` the logprobs are the scaled distribution's, and the sampled
    token itself is not used.
    """
    width = 2 * params.beam_width
    step = SamplingParams(n=1, temperature=params.temperature, max_tokens=1, ignore_eos=True,
                          logprobs=width, max_logprobs=max(20, width), seed=0)
    if step.greedy:  # below SamplingParams' greedy threshold: the raw distribution
        step.temperature = 0.0
    step.logprobs_after_temperature = step.temperature > 0
    return step


@dataclass
class _Beam:
    generated: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    cum_logprob: float = 0.0


@dataclass
class _Finished:
    beam: _Beam
    score: float
    stop_reason: int | None


class BeamSearchState:
    """The search of one prompt: :meth:`pending` beams to expand, :meth:`advance` with
    each one's candidates, until :attr:`done`; then :meth:`result`."""

    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams, max_tokens: int,
                 eos_token_ids: frozenset[int]) -> None:
        """``max_tokens``: the request's, already checked against the context length."""
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.max_tokens = max_tokens
        self.eos_token_ids = frozenset() if params.ignore_eos else eos_token_ids
        self.live: list[_Beam] = [_Beam()]
        self.finished: list[_Finished] = []
        self.steps = 0

    @property
    def done(self) -> bool:
        return not self.live

    def pending(self) -> list[list[int]]:
        """The token sequences (prompt + generated) whose next token is wanted now."""
        return [self.prompt_token_ids + b.generated for b in self.live]

    def advance(self, candidates: Sequence[PositionLogprobs]) -> None:
        """One step: ``candidates[i]`` are live beam ``i``'s next-token logprobs."""
        if len(candidates) != len(self.live):
            raise ValueError(f"got candidates for {len(candidates)} beams, "
                             f"{len(self.live)} are live")
        width = self.params.beam_width
        pool: list[tuple[float, int, int, int, PositionLogprobs]] = []
        for i, (beam, entry) in enumerate(zip(self.live, candidates, strict=True)):
            top = sorted(entry.items(), key=lambda kv: -kv[1].logprob)[:2 * width]
            kept = dict(top)
            for rank, (token, lp) in enumerate(top):
                pool.append((beam.cum_logprob + lp.logprob, i, rank, token, kept))
        # Best first; ties keep the earlier beam and its better-ranked token.
        pool.sort(key=lambda c: (-c[0], c[1], c[2]))
        self.steps += 1
        last = self.steps >= self.max_tokens
        live: list[_Beam] = []
        for place, (cum, i, _, token, kept) in enumerate(pool):
            parent = self.live[i]
            beam = _Beam(parent.generated + [token], parent.logprobs + [kept], cum)
            is_eos = token in self.eos_token_ids
            if place < width and (is_eos or last):
                self.finished.append(_Finished(
                    beam, beam_score(cum, len(beam.generated), self.params.length_penalty),
                    token if is_eos else None))
            elif not is_eos and not last and len(live) < width:
                live.append(beam)
            if place + 1 >= width and (last or len(live) == width):
                break
        self.live = live
        if self._cannot_improve():
            self.live = []

    def _cannot_improve(self) -> bool:
        """No live beam can beat the worst of the best ``W`` finished hypotheses."""
        width, lp = self.params.beam_width, self.params.length_penalty
        if not self.live or len(self.finished) < width:
            return False
        worst = sorted((f.score for f in self.finished), reverse=True)[width - 1]
        best_cum = max(b.cum_logprob for b in self.live)
        # cum <= 0 only falls; its best normalisation is the longest reachable length
        # when length_penalty > 0 and the shortest (the next token) otherwise.
        length = self.max_tokens if lp > 0 else self.steps + 1
        return beam_score(best_cum, length, lp) <= worst

    def result(self, decode: Callable[[list[int], bool], str]) -> BeamSearchOutput:
        """The best ``beam_width`` finished hypotheses; ``decode(ids, skip_special)``."""
        keep_eos = self.params.include_stop_str_in_output
        best = sorted(self.finished, key=lambda f: -f.score)[:self.params.beam_width]
        sequences = []
        for f in best:
            generated = f.beam.generated
            if f.stop_reason is not None and not keep_eos:
                generated = generated[:-1]
            sequences.append(BeamSearchSequence(
                tokens=self.prompt_token_ids + generated, logprobs=f.beam.logprobs,
                cum_logprob=f.beam.cum_logprob, text=decode(generated, not keep_eos),
                finish_reason="stop" if f.stop_reason is not None else "length",
                stop_reason=f.stop_reason, score=f.score))
        return BeamSearchOutput(sequences)


def prompt_token_ids(prompt: Any,
                     parse: Callable[[Any], tuple[str | None, list[int]]]) -> list[int]:
    """A prompt as ``LLM.generate`` takes it (text, token ids, or a dict of either),
    parsed by the engine's ``parse`` (``LLMEngine.prompt_ids``); anything else is refused
    here, before a search starts."""
    if not (isinstance(prompt, str | dict) or (
            isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))):
        raise RequestError("a prompt must be a string, a list of token ids, or a dict with "
                           "'prompt' or 'prompt_token_ids'")
    return parse(prompt)[1]


def candidates_of(out: RequestOutput) -> PositionLogprobs:
    """The one step's candidates of an expansion request."""
    logprobs = out.outputs[0].logprobs if out.outputs else None
    if not logprobs:
        reason = out.outputs[0].finish_reason if out.outputs else None
        raise RuntimeError(f"beam expansion request {out.request_id} returned no logprobs "
                           f"(finish_reason={reason})")
    return logprobs[0]


def step_batch(states: list[BeamSearchState]) -> tuple[list[BeamSearchState], list[list[int]]]:
    """The prompts still searching, and all their live beams' token sequences in order:
    one step's batch of expansion requests."""
    active = [s for s in states if not s.done]
    return active, [ids for s in active for ids in s.pending()]


def advance_all(active: list[BeamSearchState], found: Sequence[PositionLogprobs]) -> None:
    """Hand each prompt its beams' candidates from one step's batch (``step_batch``)."""
    start = 0
    for state in active:
        n = len(state.live)
        state.advance(found[start:start + n])
        start += n


def run_beam_search(states: list[BeamSearchState],
                    expand: Callable[[list[list[int]]], list[PositionLogprobs]]) -> None:
    """Drive ``states`` to the end: every step, ``expand`` runs all live beams of all
    prompts as one batch and returns each one's candidates, in order."""
    while True:
        active, seqs = step_batch(states)
        if not active:
            return
        advance_all(active, expand(seqs))


__all__ = ["BeamSearchOutput", "BeamSearchSequence", "BeamSearchState", "advance_all",
           "beam_score", "candidates_of", "check_beam_width", "expansion_params",
           "prompt_token_ids", "run_beam_search", "step_batch"]
