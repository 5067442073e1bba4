"""``suffix``: suffix decoding (vLLM's method, after Arctic Inference's SuffixDecoding).

Two sources are searched for the longest recurrence of the sequence's latest tokens
(up to ``suffix_decoding_max_tree_depth`` of them): the request's own prompt and
output, and the outputs of the server's recent finished requests (the last
``suffix_decoding_max_cached_requests`` of them, at most :data:`GLOBAL_TOKENS`
tokens). Among all occurrences of that longest match, the draft follows the most
frequent continuation token by token -- the greedy walk down a suffix tree's most
frequent children -- while its estimated probability (the product of each choice's
share of the occurrences still following) stays at or above
``suffix_decoding_min_token_prob``, for at most ``max_spec_factor`` x the match length
tokens (and the request's ``num_speculative_tokens``, which defaults to the depth). The
source whose draft has the larger expected accepted length wins.

The occurrences are found by numpy scans over flat token arrays rather than by
walking a tree: on a CPU the arrays are small next to a decode step (a scan of the
256K-token global cache takes a fraction of a millisecond) and cost no per-node
Python objects.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from glowlm.engine.sequence import Sequence
from glowlm.engine.spec_decode.ngram import suffix_matches
from glowlm.engine.spec_decode.proposer import LookupProposer, TokenHistory

#: Tokens of recent outputs kept for cross-request matching (older requests go first).
GLOBAL_TOKENS = 1 << 18
_SEPARATOR = -1  # between cached outputs: no continuation crosses it


def frequent_continuation(
    tokens: np.ndarray,
    pattern: np.ndarray,
    depth: int,
    max_tokens: int,
    spec_factor: float,
    min_prob: float,
    limit: int | None = None,
) -> tuple[list[int], float]:
    """The most frequent continuation of the longest suffix of ``pattern`` found in
    ``tokens[:limit]``, and its score (the sum of the drafted tokens' probabilities)."""
    ends, length = suffix_matches(tokens, pattern, depth, limit)
    if ends.size == 0:
        return [], 0.0
    best = int(length.max())
    survivors = ends[length == best]
    budget = min(max_tokens, max(1, int(spec_factor * best)))
    draft: list[int] = []
    prob, score = 1.0, 0.0
    n = tokens.shape[0]
    while len(draft) < budget:
        nxt_pos = survivors + 1 + len(draft)
        nxt_pos = nxt_pos[nxt_pos < n]
        nxt = tokens[nxt_pos]
        nxt = nxt[nxt != _SEPARATOR]
        if nxt.size == 0:
            break
        values, counts = np.unique(nxt, return_counts=True)
        i = int(counts.argmax())
        prob *= counts[i] / nxt.size
        if prob < min_prob:
            break
        token = int(values[i])
        draft.append(token)
        score += prob
        survivors = survivors[survivors + len(draft) < n]  # those that had this position
        survivors = survivors[tokens[survivors + len(draft)] == token]
    return draft, score


class SuffixProposer(LookupProposer):
    """vLLM's ``suffix`` method over the request and the server's recent outputs."""

    def __init__(
        self,
        max_tree_depth: int,
        max_cached_requests: int,
        max_spec_factor: float,
        min_token_prob: float,
    ) -> None:
        self.depth = max_tree_depth
        self.max_cached = max_cached_requests
        self.spec_factor = max_spec_factor
        self.min_prob = min_token_prob
        self.history = TokenHistory()
        self._cached: deque[np.ndarray] = deque()
        self._cached_tokens = 0
        self._global = np.empty(0, dtype=np.int64)

    def propose(self, seq: Sequence, max_tokens: int) -> list[int]:
        tokens = self.history.get(seq)
        pattern = tokens[-self.depth :]
        own, own_score = frequent_continuation(
            tokens,
            pattern,
            self.depth,
            max_tokens,
            self.spec_factor,
            self.min_prob,
            limit=tokens.shape[0] - 1,
        )
        if self._global.size:
            other, other_score = frequent_continuation(
                self._global, pattern, self.depth, max_tokens, self.spec_factor, self.min_prob
            )
            if other_score > own_score:
                return other
        return own

    def clear(self) -> None:
        """Forget the cached outputs (the benchmark does between rounds of one prompt)."""
        self._cached.clear()
        self._cached_tokens = 0
        self._global = np.empty(0, dtype=np.int64)

    def finished(self, seq: Sequence) -> None:
        """Keep a finished sequence's output for the requests that come after it."""
        self.history.drop(seq)
        if seq.finish_reason == "abort" or not seq.num_output_tokens:
            return
        out = np.asarray(seq.output_token_ids[-GLOBAL_TOKENS:], dtype=np.int64)
        self._cached.append(out)
        self._cached_tokens += out.size + 1
        while self._cached and (
            len(self._cached) > self.max_cached or self._cached_tokens > GLOBAL_TOKENS
        ):
            self._cached_tokens -= self._cached.popleft().size + 1
        sep = np.array([_SEPARATOR], dtype=np.int64)
        self._global = np.concatenate([part for a in self._cached for part in (a, sep)])
