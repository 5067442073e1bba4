"""Continuous batching with chunked prefill under a token budget.

Each step spends at most ``max_num_batched_tokens`` tokens: running sequences
first, in arrival order (a decode costs one token, an unfinished prompt the
next chunk that fits), then waiting sequences while the budget and the
``max_num_seqs`` cap allow. When the KV cache runs out, the most recently
arrived running sequence is preempted (its blocks freed, to be recomputed
later) until the older one fits: first come, first served, and no crash.
Where every layer attends within a window, each sequence first gives back the blocks
behind it (``BlockManager.slide``), so long sequences hold the window's blocks only.

With speculative decoding, a decoding sequence may carry drafted tokens
(``ScheduledSeq.draft_token_ids``, from ``engine/spec_decode``): they cost budget
and KV slots like prompt tokens, are dropped first when either runs short, and the
step verifies them as a short prefill.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from glowlm.engine.block_manager import BlockManager
from glowlm.engine.sequence import Request, Sequence, SequenceStatus

if TYPE_CHECKING:
    from glowlm.engine.spec_decode.speculator import Speculator


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int              # the drafts included
    #: Sequences forked from this one this step: they sample from its last logits.
    forks: list[Sequence] = field(default_factory=list)
    #: Drafted tokens after the sequence's last token, verified this step.
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def completes(self) -> bool:
        """True when this chunk reaches the last token, so a new token is sampled."""
        return (self.seq.num_computed_tokens + self.num_new_tokens
                - len(self.draft_token_ids) == self.seq.num_tokens)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq]      # decodes (1 token, or drafts) first, then prefill chunks
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    num_preempted: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_batched_tokens: int,
                 max_num_seqs: int, speculator: Speculator | None = None,
                 admit: Callable[[Sequence, list[Sequence]], bool] | None = None) -> None:
        """``admit(seq, running)``: whether a waiting sequence may join the running ones
        beyond the token and block budgets (LoRA: a slot for its adapter); a refused one
        waits, and so does every later arrival (first come, first served)."""
        self.bm = block_manager
        self.admit = admit
        self.speculator = speculator
        self.max_tokens = max_num_batched_tokens
        self.max_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._next_seq_id = 0

    def new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.bm.free_seq(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _mark_inflight(self, seq: Sequence, start: int, end: int) -> None:
        """Remember the full blocks this step computes, so sharers wait for them."""
        if self.bm.enable_prefix_caching:
            hashes = self.bm.prompt_hashes(seq)
            self._inflight.update(hashes[start // self.bm.block_size:end // self.bm.block_size])

    def _waits_for_inflight(self, seq: Sequence) -> bool:
        """True if ``seq``'s next uncached block is being computed this step by another
        sequence: admitting it next step turns that block into a cache hit."""
        if not self.bm.enable_prefix_caching:
            return False
        index = seq.num_computed_tokens // self.bm.block_size
        hashes = self.bm.prompt_hashes(seq)
        return index < len(hashes) and hashes[index] in self._inflight

    def schedule(self) -> SchedulerOutput:
        self._inflight: set[bytes] = set()
        budget = self.max_tokens
        out = SchedulerOutput([])
        running = sorted(self.running, key=lambda s: (s.request.arrival_time, s.seq_id))
        kept: list[Sequence] = []
        preempted = False
        drafts = self._drafts(running)
        while running and budget > 0:
            seq = running.pop(0)
            self.bm.slide(seq)  # blocks behind a sliding window go back before growing
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            draft = drafts.get(seq, [])[:budget - 1]
            target = seq.num_computed_tokens + num_new
            if draft and self.bm.can_grow(seq, target + len(draft)):
                num_new, target = num_new + len(draft), target + len(draft)
            else:
                draft = []
            while not self.bm.can_grow(seq, target) and running:
                self._preempt(running.pop())  # newest arrival gives way
                out.num_preempted += 1
                preempted = True
            if not self.bm.can_grow(seq, target):
                self._preempt(seq)
                out.num_preempted += 1
                preempted = True
                break
            self.bm.grow(seq, target)
            self._mark_inflight(seq, seq.num_computed_tokens, target)
            copy = self.bm.copy_on_write(seq, seq.num_computed_tokens)
            if copy:
                out.block_copies.append(copy)
            out.scheduled.append(ScheduledSeq(seq, num_new, draft_token_ids=draft))
            kept.append(seq)
            budget -= num_new
        kept.extend(running)  # not scheduled this step (budget spent), still running
        self.running = kept
        while (self.waiting and budget > 0 and len(self.running) < self.max_seqs
               and not preempted):
            seq = self.waiting[0]
            if self.admit is not None and not self.admit(seq, self.running):
                break
            if seq.num_computed_tokens == 0 and not seq.block_table:
                cached = self.bm.match_prefix(seq)
                seq.num_computed_tokens = cached
                if seq.request.metrics and cached:
                    seq.request.metrics.num_cached_tokens = max(
                        seq.request.metrics.num_cached_tokens, cached)
                self.bm.slide(seq)  # a long cached prefix keeps only its window
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            target = seq.num_computed_tokens + num_new
            if self._waits_for_inflight(seq) or not self.bm.can_grow(seq, target):
                if seq.block_table:  # do not pin cached blocks while waiting
                    self.bm.free_seq(seq)
                    seq.num_computed_tokens = 0
                break
            self.bm.grow(seq, target)
            self._mark_inflight(seq, seq.num_computed_tokens, target)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
        for item in out.scheduled:
            self._fork_if_prompt_done(item)
        # Stable: decodes and verifications (decode rows too) first, then prompt chunks.
        out.scheduled.sort(key=lambda s: s.num_new_tokens != 1 and not s.draft_token_ids)
        return out

    def _drafts(self, running: list[Sequence]) -> dict[Sequence, list[int]]:
        """The speculator's drafts for the running sequences that decode this step."""
        if self.speculator is None:
            return {}
        decoding = [s for s in running if s.num_computed_tokens == s.num_tokens - 1
                    and s.num_output_tokens > 0]
        return self.speculator.plan(decoding) if decoding else {}

    def _fork_if_prompt_done(self, item: ScheduledSeq) -> None:
        request: Request = item.seq.request
        if request.params.n == 1 or request.forked or not item.completes:
            return
        request.forked = True
        parent = item.seq
        for index in range(1, request.params.n):
            child = Sequence(
                seq_id=self.new_seq_id(), request=request, index=index,
                token_ids=list(parent.token_ids), num_prompt_tokens=parent.num_prompt_tokens,
                num_computed_tokens=parent.num_computed_tokens + item.num_new_tokens,
                status=SequenceStatus.RUNNING,
                logprobs=[] if request.params.logprobs is not None else None,
            )
            self.bm.fork(parent, child)
            request.seqs.append(child)
            self.running.append(child)
            item.forks.append(child)

    def finish(self, seq: Sequence) -> None:
        """Free a finished or aborted sequence's blocks now and drop it from the queues."""
        seq.status = SequenceStatus.FINISHED
        self.bm.free_seq(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
