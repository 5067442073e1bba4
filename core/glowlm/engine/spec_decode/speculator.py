"""What the scheduler and the engine call: drafts for a step, what was accepted.

The scheduler asks :meth:`Speculator.plan` for the drafts of its decoding sequences
before it spends the step's token budget; the runner verifies them in the step's one
forward pass (:mod:`.verify`); the engine reports back what each round accepted and
how long the step took, which the adaptive plan (:mod:`.adaptive`) learns from.
"""

from __future__ import annotations

import time

from glowlm.config import SpeculativeConfig
from glowlm.engine.sequence import Sequence
from glowlm.engine.spec_decode.adaptive import AcceptanceTracker, StepCost, plan_draft_lengths
from glowlm.engine.spec_decode.proposer import Proposer
from glowlm.engine.spec_decode.stats import SpecDecodeStats


def make_proposer(config: SpeculativeConfig) -> Proposer:
    """The config's token-lookup method (a draft model's proposer is built by the engine,
    which holds the loaded model: ``draft_model.DraftModelProposer``)."""
    if config.method == "ngram":
        from glowlm.engine.spec_decode.ngram import NgramProposer

        assert config.prompt_lookup_min is not None and config.prompt_lookup_max is not None
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    if config.method == "draft_model":
        raise ValueError("method draft_model needs the engine's DraftModelProposer")
    from glowlm.engine.spec_decode.suffix import SuffixProposer

    return SuffixProposer(
        config.suffix_decoding_max_tree_depth,
        config.suffix_decoding_max_cached_requests,
        config.suffix_decoding_max_spec_factor,
        config.suffix_decoding_min_token_prob,
    )


class Speculator:
    """One engine's speculative decoding: proposer, adaptive plan, counters."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int,
                 proposer: Proposer | None = None, draft_max_len: int | None = None) -> None:
        """``proposer``: one built by the caller (a draft model's), else the config's
        lookup method; ``draft_max_len``: the draft model's positions."""
        self.config = config
        self.proposer = proposer if proposer is not None else make_proposer(config)
        self.max_model_len = max_model_len
        #: A draft model's positions: it drafts no token past them.
        self.draft_max_len = draft_max_len if draft_max_len is not None else max_model_len
        self.cost = StepCost()
        self.acceptance = AcceptanceTracker()
        self.stats = SpecDecodeStats(accepted_per_pos=[0] * config.num_speculative_tokens)
        #: Seconds the proposer's own forwards took in this step's plan (a draft model):
        #: inside the engine's step time, but not the target's step cost.
        self._proposal_seconds = 0.0

    def room(self, seq: Sequence) -> int:
        """Most drafts ``seq`` may take: the config's bound, and no token past max_tokens
        or the context (the target's own token after the drafts always comes)."""
        request = seq.request
        if request.params.structured_outputs is not None:
            return 0  # the grammar matcher follows accepted tokens only
        return max(
            0,
            min(
                self.config.num_speculative_tokens,
                request.max_tokens - seq.num_output_tokens - 1,
                self.max_model_len - seq.num_tokens - 1,
                self.draft_max_len - seq.num_tokens,
            ),
        )

    def plan(self, decoding: list[Sequence]) -> dict[Sequence, list[int]]:
        """Drafts for this step's decoding sequences (only those that draft)."""
        self._proposal_seconds = 0.0
        if self.proposer.cost is not None:
            return self._plan_then_draft(decoding)
        rooms = [self.room(s) for s in decoding]
        drafts = self.proposer.propose_batch(decoding, rooms)
        proposals = [(s, d[:r]) for s, d, r in zip(decoding, drafts, rooms, strict=True)
                     if d and r]
        if not proposals:
            return {}
        if not self.config.adaptive:
            return dict(proposals)
        lengths = plan_draft_lengths(
            [self.acceptance.alpha(s) for s, _ in proposals],
            [len(d) for _, d in proposals],
            len(decoding),
            self.cost,
        )
        planned = {}
        for (seq, draft), k in zip(proposals, lengths, strict=True):
            if k:
                planned[seq] = draft[:k]
            else:
                self.acceptance.idle(seq)
        return planned

    def _plan_then_draft(self, decoding: list[Sequence]) -> dict[Sequence, list[int]]:
        """A draft model: how many tokens each sequence drafts is planned first (its
        offer is its room), counting the draft's measured forwards, then it drafts
        just those; a sequence planned at 0 costs no draft forward."""
        proposer = self.proposer
        assert proposer.cost is not None
        seqs = [s for s in decoding if self.room(s)]
        if not seqs:
            return {}
        lengths = [self.room(s) for s in seqs]
        if self.config.adaptive:
            k = self.config.num_speculative_tokens
            lengths = plan_draft_lengths(
                [self.acceptance.alpha(s) for s in seqs], lengths, len(decoding), self.cost,
                draft_cost=proposer.cost,
                first_rows=[min(proposer.unseen(s), k + 1) for s in seqs])
            for seq, n in zip(seqs, lengths, strict=True):
                if not n:
                    self.acceptance.idle(seq)
        t0 = time.perf_counter()
        drafts = proposer.propose_batch(seqs, lengths)
        self._proposal_seconds = time.perf_counter() - t0
        return {s: d for s, d in zip(seqs, drafts, strict=True) if d}

    def observe(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """One verification round of ``seq``: ``accepted`` of ``drafted`` tokens."""
        self.stats.record(drafted, accepted)
        self.acceptance.observe(seq, drafted, accepted)

    def observe_step(self, num_tokens: int, drafted: bool, seconds: float) -> None:
        """A step without prompt chunks: ``num_tokens`` query tokens in ``seconds`` (the
        draft model's forwards of its plan taken out: they are priced on their own)."""
        self.cost.observe(num_tokens, drafted, seconds - self._proposal_seconds)
        self._proposal_seconds = 0.0

    def finished(self, seq: Sequence) -> None:
        self.proposer.finished(seq)
