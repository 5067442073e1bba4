"""Paged KV cache bookkeeping: block tables, reference counts, prefix cache.

Blocks are reference counted so sequences can share them (forks of one
prompt, identical prefixes of different requests). A block that is full and
computed gets a hash of its tokens chained to the hash of everything before it;
with prefix caching on, a new sequence reuses blocks whose hashes match, and a
block freed by its last user stays findable until it is evicted, least recently
freed first. The deepest blocks of a freed sequence are evicted before its
shallow ones, because shallow ones are shared by more prompts.

A model whose every layer attends within a sliding window (Mistral, Phi-3-mini-4k,
Starcoder2, Qwen2 with ``use_sliding_window``) never reads a key that fell out of the
window again, so :meth:`BlockManager.slide` gives such blocks back as the sequence
grows: a sequence far longer than the window holds only the window's blocks (plus the
step's chunk). Their entries in the block table become :data:`NO_BLOCK`; the attention
backends start reading at the window's first block, so they never look them up.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from glowlm.engine.sequence import Sequence

#: A block-table entry given back by :meth:`BlockManager.slide` (the model runner passes
#: block 0 in its place; no kernel reads a block before the window).
NO_BLOCK = -1


def block_hash(parent: bytes | None, tokens: list[int]) -> bytes:
    """Content hash of a full block given its predecessor's hash (16 bytes of BLAKE2b)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"root")
    h.update(array("q", tokens).tobytes())
    return h.digest()


@dataclass
class PrefixCacheStats:
    queries: int = 0   # prompt tokens looked up
    hits: int = 0      # of those, tokens found in the cache

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 window: int | None = None) -> None:
        """``window``: the model's attention window when every layer has one (the
        smallest), so blocks behind it can be given back (:meth:`slide`); None keeps
        every block of a sequence (a full-attention layer may read any key)."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.window = window
        #: blocks given back by :meth:`slide` (all sequences, since start)
        self.num_slid_blocks = 0
        self.ref_counts = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}
        # Free blocks in eviction order (front = evicted first); values unused.
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.stats = PrefixCacheStats()

    # -- queries -----------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks ``seq`` needs to hold ``num_tokens`` tokens in total."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= len(self.free)

    # -- allocation ---------------------------------------------------------------------

    def _take_free(self) -> int:
        block, _ = self.free.popitem(last=False)
        old = self.hash_of[block]
        if old is not None:  # evict its cached content
            if self.cached.get(old) == block:
                del self.cached[old]
            self.hash_of[block] = None
        self.ref_counts[block] = 1
        return block

    def _ref(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self.free[block]
        self.ref_counts[block] += 1

    def prompt_hashes(self, seq: Sequence) -> list[bytes]:
        """Hashes of every full block of ``seq``'s tokens (computed once, then kept)."""
        tokens = seq.token_ids
        full = len(tokens) // self.block_size
        while len(seq.block_hashes) < full:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[i - 1] if i else seq.request.cache_salt
            seq.block_hashes.append(
                block_hash(parent, tokens[i * self.block_size:(i + 1) * self.block_size]))
        return seq.block_hashes

    def match_prefix(self, seq: Sequence) -> int:
        """Attach cached blocks for the longest cached prefix of a fresh sequence.

        Returns the number of tokens found. At least one token is always left to
        compute, because the last position's logits are needed for sampling. A request
        that asks for prompt log-probabilities reuses nothing: the cache holds keys and
        values, not the logits of the positions it would skip.
        """
        if (not self.enable_prefix_caching or seq.block_table
                or seq.request.prompt_logprobs is not None):
            return 0
        hashes = self.prompt_hashes(seq)
        usable = (seq.num_tokens - 1) // self.block_size
        self.stats.queries += seq.num_tokens
        found = 0
        for h in hashes[:usable]:
            block = self.cached.get(h)
            if block is None:
                break
            self._ref(block)
            seq.block_table.append(block)
            found += 1
        self.stats.hits += found * self.block_size
        return found * self.block_size

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Give ``seq`` enough blocks for ``num_tokens`` tokens (caller checked can_grow)."""
        for _ in range(self.blocks_needed(seq, num_tokens)):
            seq.block_table.append(self._take_free())

    def slide(self, seq: Sequence) -> int:
        """Give back ``seq``'s blocks that no later query can see; returns how many.

        The next query is at position ``num_computed_tokens`` and sees keys ``p`` with
        ``q - window < p``; later queries see less. So every block whose last position is
        at most ``q - window`` is dead for all layers. A cached block stays findable in
        the free list (a later prompt with this prefix still hits it until eviction)."""
        if self.window is None:
            return 0
        dead = max(0, seq.num_computed_tokens - self.window + 1) // self.block_size
        dead = min(dead, len(seq.block_table))
        freed = 0
        for i in range(seq.num_dropped_blocks, dead):
            block = seq.block_table[i]
            if block == NO_BLOCK:
                continue
            seq.block_table[i] = NO_BLOCK
            self._unref(block)
            freed += 1
        seq.num_dropped_blocks = max(seq.num_dropped_blocks, dead)
        self.num_slid_blocks += freed
        return freed

    def _unref(self, block: int) -> None:
        """Drop one reference; a block nobody holds becomes free (uncached ones first)."""
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free[block] = None
            if self.hash_of[block] is None:
                self.free.move_to_end(block, last=False)  # uncached: reuse first

    def trim(self, seq: Sequence) -> None:
        """Give back the blocks past ``seq``'s tokens: those a verification step grew for
        drafts the target rejected. Nothing is copied; their slots are simply rewritten
        by later steps. Such a block is private and holds no computed full block, so it
        goes back uncached, to be reused first."""
        keep = -(-seq.num_tokens // self.block_size)
        while len(seq.block_table) > keep:
            block = seq.block_table.pop()
            if block != NO_BLOCK:
                self._unref(block)

    def copy_on_write(self, seq: Sequence, position: int) -> tuple[int, int] | None:
        """Before writing ``position``, unshare its block; returns ``(src, dst)`` to copy."""
        index = position // self.block_size
        if index >= len(seq.block_table):
            return None
        block = seq.block_table[index]
        if self.ref_counts[block] <= 1:
            return None
        new = self._take_free()
        self.ref_counts[block] -= 1
        seq.block_table[index] = new
        return block, new

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` shares every block of ``parent`` (copy on write later)."""
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_registered_blocks = parent.num_registered_blocks
        child.num_dropped_blocks = parent.num_dropped_blocks
        for block in child.block_table:
            if block != NO_BLOCK:
                self.ref_counts[block] += 1

    def free_seq(self, seq: Sequence) -> None:
        """Drop ``seq``'s references; unreferenced blocks become free (deepest first)."""
        for block in reversed(seq.block_table):
            if block != NO_BLOCK:
                self._unref(block)
        seq.block_table = []
        seq.num_registered_blocks = 0  # content hashes stay valid; keep block_hashes
        seq.num_dropped_blocks = 0

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register hashes of ``seq``'s blocks that are now full and computed."""
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens, seq.num_tokens) // self.block_size
        if full <= seq.num_registered_blocks:
            return
        self.prompt_hashes(seq)
        for i in range(seq.num_registered_blocks, full):
            block = seq.block_table[i]
            h = seq.block_hashes[i]
            if block != NO_BLOCK and self.hash_of[block] is None and h not in self.cached:
                self.hash_of[block] = h
                self.cached[h] = block
        seq.num_registered_blocks = max(seq.num_registered_blocks, full)
