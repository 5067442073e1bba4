"""How many tokens to draft: measured acceptance against the measured cost of verifying.

Two measurements, both online, from the engine's own steps:

- :class:`StepCost`: this host's time of a decode step (no prompt chunk) by the number
  of rows it runs, each row count's own running average of the steps seen with it.
  Measured, not modelled: on a CPU the cost is not linear in the rows -- kernels change
  with the row count (a one-row GEMV, several-row GEMMs, a fused whole-stack op that
  covers only the smallest counts), so a step of five rows may cost 1.1x or 3x a step of
  one depending on the model and host. A row count not seen yet is interpolated between
  the nearest measured ones, or, past the largest, extrapolated at a mild 2 % per row:
  optimistic on purpose, so each size gets tried and its real cost measured.
- :class:`AcceptanceTracker`: each sequence's chance ``alpha`` that a drafted token is
  accepted, from its recent verifications (accepted / (accepted + first rejection)).
  A sequence that stops drafting regains the prior slowly, so it probes again later.

The plan (:func:`plan_draft_lengths`) adds draft tokens in order of their chance of
being reached and accepted (``alpha ** j`` for a sequence's ``j``-th), and keeps the
prefix of that order with the most expected tokens per second, ``(B + gain) /
T(B + drafted)`` against the plain ``B / T(B)``: a sequence that never matches drafts
nothing, and a batch where a bigger step costs more than its drafts bring drafts nothing
either.

With a draft model the drafts are not free: its own forward steps are measured the
same way (a :class:`StepCost` of the draft, by the rows of each of its forwards) and
added to the target's step, ``T(B + drafted) + sum_j D(rows_j)``. The draft's ``j``-th
forward runs one row per sequence drafting ``j`` or more tokens; its first one also
feeds what the sequence has not shown the draft yet, priced at most ``k + 1`` rows a
sequence (the tokens accepted last step and the target's own): a longer catch-up (the
prompt, or after a pause in drafting) is paid once and serves every later step, so it
is not charged to one step's plan. So a draft whose cost per token comes near what its
accepted tokens save drafts less, and one that never pays drafts nothing.
"""

from __future__ import annotations

import heapq
import weakref

from glowlm.engine.sequence import Sequence

PRIOR_TOKEN_SHARE = 0.02  # an unmeasured extra row: 2 % of the largest measured step
STEP_AVERAGE = 0.2  # weight of a new step in its row count's running average
OUTLIER = 3.0  # a step slower than this x its estimate counts as this (a busy host)
PRIOR_ALPHA = 0.6
PRIOR_ALPHA_WEIGHT = 2.0
ALPHA_DECAY = 0.8  # per verification of the sequence
IDLE_DECAY = 0.97  # per step the sequence could have drafted and did not


class StepCost:
    """Decode step seconds by row count: measured averages, interpolated in between."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}
        self.observations = 0

    def observe(self, tokens: int, multi: bool, seconds: float) -> None:
        """A decode step (no prompt chunk) of ``tokens`` rows took ``seconds``;
        ``multi``: it verified drafts (the rows are decode rows either way)."""
        if seconds <= 0 or tokens < 1:
            return
        old = self.seconds.get(tokens)
        if old is None:
            guess = self.predict(tokens) if self.seconds else None
            self.seconds[tokens] = min(seconds, OUTLIER * guess) if guess else seconds
        else:
            seconds = min(seconds, OUTLIER * old)
            self.seconds[tokens] = old + STEP_AVERAGE * (seconds - old)
        self.observations += 1

    @property
    def ready(self) -> bool:
        return bool(self.seconds)

    def predict(self, tokens: int) -> float:
        """Seconds of a decode step of ``tokens`` rows (``ready`` must be true)."""
        if tokens in self.seconds:
            return self.seconds[tokens]
        sizes = sorted(self.seconds)
        below = [n for n in sizes if n < tokens]
        above = [n for n in sizes if n > tokens]
        if not below:
            return self.seconds[above[0]]
        lo = below[-1]
        if not above:
            return self.seconds[lo] * (1 + PRIOR_TOKEN_SHARE * (tokens - lo))
        hi = above[0]
        share = (tokens - lo) / (hi - lo)
        return self.seconds[lo] + share * (self.seconds[hi] - self.seconds[lo])


class AcceptanceTracker:
    """Each sequence's recent chance of a drafted token being accepted."""

    def __init__(self) -> None:
        self._counts: weakref.WeakKeyDictionary[Sequence, list[float]] = weakref.WeakKeyDictionary()

    def alpha(self, seq: Sequence) -> float:
        acc, trials = self._counts.get(seq, (0.0, 0.0))
        return (acc + PRIOR_ALPHA * PRIOR_ALPHA_WEIGHT) / (trials + PRIOR_ALPHA_WEIGHT)

    def observe(self, seq: Sequence, drafted: int, accepted: int) -> None:
        counts = self._counts.setdefault(seq, [0.0, 0.0])
        counts[0] = ALPHA_DECAY * counts[0] + accepted
        counts[1] = ALPHA_DECAY * counts[1] + accepted + (1 if accepted < drafted else 0)

    def idle(self, seq: Sequence) -> None:
        counts = self._counts.get(seq)
        if counts is not None:
            counts[0] *= IDLE_DECAY
            counts[1] *= IDLE_DECAY


def _draft_seconds(draft_cost: StepCost, rows: int) -> float:
    """A draft forward of ``rows`` rows; free until one is measured (so it is tried)."""
    return draft_cost.predict(rows) if rows and draft_cost.ready else 0.0


def plan_draft_lengths(
    alphas: list[float],
    proposed: list[int],
    num_decodes: int,
    cost: StepCost,
    draft_cost: StepCost | None = None,
    first_rows: list[int] | None = None,
) -> list[int]:
    """Draft length per proposing sequence (``proposed``: tokens each proposer offers),
    for a step of ``num_decodes`` decoding sequences; all zero when no drafting raises
    the step's expected tokens per second. ``draft_cost``: a draft model's forwards,
    whose first one runs ``first_rows[i]`` rows for sequence ``i`` (its catch-up)."""
    lengths = [0] * len(proposed)
    if not cost.ready:
        return lengths
    best_rate = num_decodes / cost.predict(num_decodes)
    best = list(lengths)
    # Max-heap of each sequence's next draft token's chance: alpha ** (drafted + 1).
    heap = [(-a, i) for i, (a, n) in enumerate(zip(alphas, proposed, strict=True)) if n > 0]
    heapq.heapify(heap)
    rows, gain = num_decodes, 0.0
    draft_rows: list[int] = []  # rows of the draft model's j-th forward
    drafting = 0.0  # their predicted seconds
    while heap:
        neg, i = heapq.heappop(heap)
        lengths[i] += 1
        rows += 1
        gain -= neg
        if draft_cost is not None:
            j = lengths[i] - 1
            if j == len(draft_rows):
                draft_rows.append(0)
            old = draft_rows[j]
            draft_rows[j] += first_rows[i] if j == 0 and first_rows is not None else 1
            drafting += _draft_seconds(draft_cost, draft_rows[j]) - _draft_seconds(draft_cost, old)
        rate = (num_decodes + gain) / (cost.predict(rows) + drafting)
        if rate > best_rate:
            best_rate, best = rate, list(lengths)
        if lengths[i] < proposed[i]:
            heapq.heappush(heap, (neg * alphas[i], i))
    return best
