"""The counters ``/metrics`` and the benchmarks show, with vLLM's meanings.

``num_drafts``: verification rounds (one per drafted sequence per step);
``num_draft_tokens``: tokens drafted; ``num_accepted_tokens``: drafted tokens the
target accepted; ``accepted_per_pos[i]``: rounds whose draft at position ``i`` was
accepted. Acceptance rate is accepted / drafted; mean accepted length per round is
``1 + accepted / num_drafts`` (the bonus token counts).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def record(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        if len(self.accepted_per_pos) < drafted:
            self.accepted_per_pos.extend([0] * (drafted - len(self.accepted_per_pos)))
        for i in range(accepted):
            self.accepted_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verification round (accepted drafts + the target's own)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0
