"""``draft_model``: a small model with the target's tokenizer drafts greedily.

The draft runs on the driver between the target's steps, on the engine's own pieces:
a :class:`~glowlm.engine.model_runner.ModelRunner` over its own paged KV cache and a
:class:`~glowlm.engine.block_manager.BlockManager` of its own blocks (as many tokens as
the target's cache holds, sized by the memory plan). Each target sequence has a shadow
:class:`~glowlm.engine.sequence.Sequence` in the draft: its tokens, its block table and
how many of them the draft's cache holds.

One step drafts for all drafting sequences at once:

1. **catch-up**: the tokens of each sequence the draft has not seen (the prompt the
   first time, then the drafts the target accepted and its own token) run as one
   batched forward -- chunked by the engine's token budget, as prefill is -- whose
   last row's argmax is the first draft;
2. **k - 1 decode forwards**, one row per sequence still drafting, each feeding the
   previous draft.

Rollback is free: the shadow keeps its tokens up to where they agree with the
target's, its cache length is cut back to that, and the rejected positions' slots are
rewritten by the next catch-up. Drafts are the draft's argmax, so they do not depend on
the target's sampling noise and the verifier keeps the target's distribution exactly
(:mod:`.verify`). When the draft's blocks run short, the shadows of sequences not
drafting this step give theirs back first (least recently drafted first); a sequence
that still does not fit does not draft this step. No prefix caching in the draft: a
fork (``n > 1``) or a repeated prompt is caught up from its first token.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from glowlm.engine.block_manager import BlockManager
from glowlm.engine.scheduler import ScheduledSeq, SchedulerOutput
from glowlm.engine.sequence import Sequence
from glowlm.engine.spec_decode.adaptive import StepCost


@dataclass
class DraftModel:
    """The loaded draft model and its cache's size (engine set-up builds it)."""

    model: torch.nn.Module
    backend: Any                   # its own attention backend instance
    num_blocks: int
    block_size: int
    kv_dtype: torch.dtype
    #: Positions the draft serves (its config's, capped by speculative_config
    #: max_model_len and the target's).
    max_model_len: int
    name: str = ""


@dataclass
class _Shadow:
    """A target sequence's state in the draft: ``seq.token_ids`` are the target's first
    ``synced`` tokens (copied; the target's only grow) and then the draft's own drafts."""

    seq: Sequence
    synced: int

    def agreement(self, theirs: list[int]) -> int:
        """How many leading tokens the shadow shares with the target's ``theirs``."""
        mine = self.seq.token_ids
        common, limit = self.synced, min(len(mine), len(theirs))
        while common < limit and mine[common] == theirs[common]:
            common += 1
        return min(common, limit)


class DraftModelProposer:
    """vLLM's ``draft_model`` method: greedy drafts from a small model, batched."""

    def __init__(self, draft: DraftModel, max_num_batched_tokens: int) -> None:
        from glowlm.engine.model_runner import ModelRunner

        self.draft = draft
        self.runner = ModelRunner(draft.model, draft.backend, draft.num_blocks,
                                  draft.block_size, draft.kv_dtype)
        self.block_manager = BlockManager(draft.num_blocks, draft.block_size, False)
        self.max_tokens = max(1, max_num_batched_tokens)
        #: The draft's forwards, by rows (adaptive.py adds them to the plan).
        self.cost: StepCost | None = StepCost()
        #: target sequence -> its shadow in the draft; least recently drafted first.
        self._shadows: OrderedDict[Sequence, _Shadow] = OrderedDict()

    # -- shadows --------------------------------------------------------------------

    def _shadow(self, seq: Sequence) -> Sequence:
        """``seq``'s shadow holding the target's tokens, its cache length cut back to
        where the two agree (the rejected drafts' positions get rewritten)."""
        entry = self._shadows.get(seq)
        if entry is None:
            shadow = Sequence(seq.seq_id, seq.request, seq.index, list(seq.token_ids),
                              seq.num_prompt_tokens)
            self._shadows[seq] = _Shadow(shadow, seq.num_tokens)
            return shadow
        self._shadows.move_to_end(seq)
        shadow, theirs = entry.seq, seq.token_ids
        common = entry.agreement(theirs)
        # At least the last token is fed again: its logits give the first draft.
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, common, len(theirs) - 1)
        del shadow.token_ids[common:]
        shadow.token_ids.extend(theirs[common:])
        entry.synced = len(theirs)
        return shadow

    def unseen(self, seq: Sequence) -> int:
        """Tokens of ``seq`` the draft has not run yet (what a catch-up would feed)."""
        entry = self._shadows.get(seq)
        if entry is None:
            return seq.num_tokens
        computed = min(entry.seq.num_computed_tokens, entry.agreement(seq.token_ids),
                       seq.num_tokens - 1)
        return seq.num_tokens - computed

    def _fits(self, shadow: Sequence, tokens: int, keep: set[Sequence]) -> bool:
        """Grow ``shadow`` to ``tokens`` tokens, giving back other shadows' blocks (not
        of ``keep``, least recently drafted first) when the draft's cache is short."""
        bm = self.block_manager
        if not bm.can_grow(shadow, tokens):
            for seq, entry in list(self._shadows.items()):
                other = entry.seq
                if seq in keep or not other.block_table:
                    continue
                bm.free_seq(other)
                other.num_computed_tokens = 0
                if bm.can_grow(shadow, tokens):
                    break
            else:
                return False
        bm.grow(shadow, tokens)
        return True

    # -- drafting -------------------------------------------------------------------

    def propose_batch(self, seqs: list[Sequence], rooms: list[int]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in seqs]
        keep = {s for s, r in zip(seqs, rooms, strict=True) if r}
        active: list[tuple[int, Sequence, int]] = []  # (index, shadow, tokens to draft)
        for i, (seq, room) in enumerate(zip(seqs, rooms, strict=True)):
            if not room:
                continue
            shadow = self._shadow(seq)
            # The cache holds every token but the last draft, which is never fed.
            if self._fits(shadow, seq.num_tokens + room - 1, keep):
                active.append((i, shadow, room))
            else:
                keep.discard(seq)
        if not active:
            return drafts
        self._catch_up(active, drafts)
        for step in range(1, max(room for _, _, room in active)):
            rows = [(i, shadow) for i, shadow, room in active if room > step]
            items = []
            for i, shadow in rows:
                shadow.token_ids.append(drafts[i][-1])
                items.append(ScheduledSeq(shadow, 1))
            for (i, _), token in zip(rows, self._forward(items), strict=True):
                drafts[i].append(token)
        for i, shadow, _ in active:  # the shadow ends with its drafts (rolled back later)
            shadow.token_ids.append(drafts[i][-1])
        return drafts

    def _catch_up(self, active: list[tuple[int, Sequence, int]],
                  drafts: list[list[int]]) -> None:
        """Feed every shadow its unseen tokens, in forwards of at most the engine's
        token budget; the last row of each gives its first draft."""
        pending = [(i, shadow) for i, shadow, _ in active]
        while pending:
            budget, items, rows = self.max_tokens, [], []
            for i, shadow in pending:
                n = min(shadow.num_tokens - shadow.num_computed_tokens, budget)
                if n <= 0:
                    break
                items.append(ScheduledSeq(shadow, n))
                rows.append((i, shadow, n))
                budget -= n
            # Decode rows (one token) first, as the attention metadata expects.
            order = sorted(range(len(items)), key=lambda j: items[j].num_new_tokens != 1)
            tokens = self._forward([items[j] for j in order])
            done = set()
            for j, token in zip(order, tokens, strict=True):
                i, shadow, _ = rows[j]
                if shadow.num_computed_tokens == shadow.num_tokens:
                    drafts[i].append(token)
                    done.add(i)
            pending = [(i, s) for i, s in pending if i not in done]

    def _forward(self, items: list[ScheduledSeq]) -> list[int]:
        """One draft forward over ``items``: the argmax after each item's last token;
        each shadow's cache length advances by its tokens. Timed into ``cost``."""
        t0 = time.perf_counter()
        logits = self.runner.last_logits(SchedulerOutput(items))
        tokens = logits.argmax(dim=-1).tolist()
        rows = 0
        for item in items:
            item.seq.num_computed_tokens += item.num_new_tokens
            rows += item.num_new_tokens
        assert self.cost is not None
        self.cost.observe(rows, False, time.perf_counter() - t0)
        return tokens

    def finished(self, seq: Sequence) -> None:
        entry = self._shadows.pop(seq, None)
        if entry is not None:
            self.block_manager.free_seq(entry.seq)
