"""The proposer protocol, and each sequence's tokens as a growing numpy array.

Every proposer runs on the scheduler's thread between steps. Two kinds:

- token lookups (prompt lookup, suffix matching: :class:`LookupProposer`) draft from
  tokens alone, need no model or KV cache and cost next to nothing, so the speculator
  asks them first and plans how many of their tokens pay afterwards;
- a draft model (:mod:`.draft_model`) spends forward steps of its own, measured in
  ``cost``, so the speculator plans the lengths first and the model drafts just those.

Drafts are deterministic (a lookup, a draft model's argmax): the verifier accepts a
drafted token with the target's probability of it, which keeps the output distribution
exactly the target's (:mod:`.verify`).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Protocol

import numpy as np

from glowlm.engine.sequence import Sequence

if TYPE_CHECKING:
    from glowlm.engine.spec_decode.adaptive import StepCost


class Proposer(Protocol):
    """Drafts the next tokens of the step's decoding sequences from what they have seen."""

    #: The proposer's own forward steps' measured seconds by row count (a draft model),
    #: which the adaptive plan adds to the target's step; None for token lookups, whose
    #: cost does not count and whose offers are known only after proposing.
    cost: StepCost | None

    def unseen(self, seq: Sequence) -> int:
        """Tokens of ``seq`` the proposer's own model has not run yet (the rows its
        catch-up would feed; a proposer without a model reports 0)."""
        ...

    def propose_batch(self, seqs: list[Sequence], rooms: list[int]) -> list[list[int]]:
        """For each of ``seqs``, up to ``rooms[i]`` tokens likely to follow its
        ``token_ids`` (maybe none; a room of 0 asks for none).

        Called once per step with the decoding sequences, before the step is
        scheduled; must not change the sequences."""
        ...

    def finished(self, seq: Sequence) -> None:
        """``seq`` finished (or was aborted): drop its state, learn from its output."""
        ...


class LookupProposer:
    """A proposer that drafts each sequence from its tokens alone (ngram, suffix)."""

    cost: StepCost | None = None

    def unseen(self, seq: Sequence) -> int:
        return 0

    def propose(self, seq: Sequence, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens likely to follow ``seq.token_ids`` (maybe none)."""
        raise NotImplementedError

    def propose_batch(self, seqs: list[Sequence], rooms: list[int]) -> list[list[int]]:
        return [self.propose(s, r) if r else [] for s, r in zip(seqs, rooms, strict=True)]

    def finished(self, seq: Sequence) -> None:
        raise NotImplementedError


class TokenHistory:
    """``seq.token_ids`` mirrored into an int64 array, appended to as the sequence grows,
    so a proposer's scans are numpy passes rather than Python loops over a list."""

    def __init__(self) -> None:
        self._arrays: weakref.WeakKeyDictionary[Sequence, list] = weakref.WeakKeyDictionary()

    def get(self, seq: Sequence) -> np.ndarray:
        entry = self._arrays.get(seq)
        n = seq.num_tokens
        if entry is None:
            buf = np.empty(max(64, 2 * n), dtype=np.int64)
            buf[:n] = seq.token_ids
            self._arrays[seq] = [buf, n]
            return buf[:n]
        buf, have = entry
        if have > n:  # never happens with append-only tokens; resync to be safe
            have = 0
        if n > buf.shape[0]:
            grown = np.empty(2 * n, dtype=np.int64)
            grown[:have] = buf[:have]
            buf = entry[0] = grown
        if n > have:
            buf[have:n] = seq.token_ids[have:n]
            entry[1] = n
        return buf[:n]

    def drop(self, seq: Sequence) -> None:
        self._arrays.pop(seq, None)
