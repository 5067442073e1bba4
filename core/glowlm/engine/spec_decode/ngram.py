"""``ngram``: prompt lookup decoding over the prompt and the tokens generated so far.

The longest suffix of the sequence of ``prompt_lookup_min`` .. ``prompt_lookup_max``
tokens that occurred earlier proposes the tokens that followed its most recent earlier
occurrence. When that continuation runs into the present (the text is looping with a
period shorter than the draft), it is continued with the same period, which is what
the match predicts.
"""

from __future__ import annotations

import numpy as np

from glowlm.engine.sequence import Sequence
from glowlm.engine.spec_decode.proposer import LookupProposer, TokenHistory


def suffix_matches(
    tokens: np.ndarray, pattern: np.ndarray, longest: int, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Where the last tokens of ``pattern`` end in ``tokens[:limit]``: ``(ends, lengths)``,
    ``lengths[i]`` (1 .. ``longest``) being how many of them match backwards from
    ``tokens[ends[i]]``. Only ends whose last token matches are returned."""
    limit = tokens.shape[0] if limit is None else limit
    p = pattern.shape[0]
    ends = np.flatnonzero(tokens[:limit] == pattern[p - 1])
    length = np.ones(ends.size, dtype=np.int64)
    alive = np.ones(ends.size, dtype=bool)
    for j in range(1, min(longest, p)):
        idx = ends - j
        ok = alive & (idx >= 0)
        ok[ok] = tokens[idx[ok]] == pattern[p - 1 - j]
        alive = ok
        if not alive.any():
            break
        length += alive
    return ends, length


def lookup(tokens: np.ndarray, lo: int, hi: int, k: int) -> list[int]:
    """Up to ``k`` tokens following the latest earlier occurrence of the longest suffix of
    ``tokens`` with ``lo`` <= length <= ``hi``; [] when no suffix of ``lo`` tokens recurs."""
    n = tokens.shape[0]
    if k < 1 or n < lo + 1:
        return []
    # Candidate ends: earlier positions holding the last token.
    ends, length = suffix_matches(tokens, tokens, hi, limit=n - 1)
    if ends.size == 0:
        return []
    best = int(length.max())
    if best < lo:
        return []
    end = int(ends[np.flatnonzero(length == best)[-1]])  # the most recent of the longest
    period = n - 1 - end
    draft = tokens[end + 1 : end + 1 + k].tolist()
    while len(draft) < k:  # the continuation reached the present: repeat with its period
        draft.append(draft[len(draft) - period])
    return draft


class NgramProposer(LookupProposer):
    """vLLM's ``ngram`` method (``prompt_lookup_min``, ``prompt_lookup_max``)."""

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.lo, self.hi = prompt_lookup_min, prompt_lookup_max
        self.history = TokenHistory()

    def propose(self, seq: Sequence, max_tokens: int) -> list[int]:
        return lookup(self.history.get(seq), self.lo, self.hi, max_tokens)

    def finished(self, seq: Sequence) -> None:
        self.history.drop(seq)
