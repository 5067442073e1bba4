"""Which drafted tokens the target accepts: speculative sampling for deterministic drafts.

A step feeds the sequence's last token and its ``k`` drafts ``d_1..d_k`` at once, so
the target gives ``k + 1`` distributions ``p_0..p_k`` (``p_j`` is for the token after
``d_j``). Each position is sampled exactly as plain decoding would sample it there:
the same processors, penalties over the output so far *including the drafts before
it*, ``min_tokens``, temperature, top-k/p, and for seeded requests the same noise,
keyed by (seed, completion, output position). Then ``t_j`` is the target's token at
position ``j`` and the step emits ``t_0 .. t_a``, where ``a`` is the number of leading
drafts with ``d_{j+1} == t_j``.

That is the rejection sampler of the speculative-sampling papers for a draft that puts
all its mass on one token ``x``: ``t`` is drawn from ``p``, so ``x`` is accepted with
probability ``p(x)`` (= min(1, p(x)/q(x)) with q(x) = 1), and on a mismatch ``t`` is
distributed as ``p`` conditioned on ``t != x`` -- the residual ``max(0, p - q)``
renormalised. Drawing ``t`` with the plain run's noise makes it more than exact in
distribution: a seeded request emits the same tokens with and without speculation, and
whatever number of tokens each step drafted. Greedy is the zero-temperature case:
``t_j`` is the argmax, token for token the plain run's. Log-probabilities are the
target's at each emitted position.
"""

from __future__ import annotations

from dataclasses import dataclass

from glowlm.engine.sequence import Request, Sequence


@dataclass(eq=False)
class DraftPosition:
    """A sequence as it would be after its first ``len(drafted)`` drafts were accepted:
    what the sampling batch reads for one verification row (output so far, counts)."""

    seq: Sequence
    drafted: list[int]

    @property
    def request(self) -> Request:
        return self.seq.request

    @property
    def index(self) -> int:
        return self.seq.index

    @property
    def num_prompt_tokens(self) -> int:
        return self.seq.num_prompt_tokens

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids + self.drafted

    @property
    def output_token_ids(self) -> list[int]:
        return self.seq.output_token_ids + self.drafted

    @property
    def num_output_tokens(self) -> int:
        return self.seq.num_output_tokens + len(self.drafted)


def verification_rows(seq: Sequence, drafts: list[int]) -> list[Sequence | DraftPosition]:
    """The ``len(drafts) + 1`` sampling rows of one drafted sequence, in position order."""
    return [seq, *(DraftPosition(seq, drafts[:j]) for j in range(1, len(drafts) + 1))]


def num_accepted(drafts: list[int], target_tokens: list[int]) -> int:
    """Leading drafts equal to the target's token at their position (``target_tokens``
    has one more entry than ``drafts``: the bonus position after the last draft)."""
    a = 0
    for d, t in zip(drafts, target_tokens, strict=False):
        if d != t:
            break
        a += 1
    return a
