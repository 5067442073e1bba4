"""Bidirectional attention over packed sequences, for encoders (BERT, XLM-RoBERTa,
ModernBERT).

An encoder sees its whole input at once and keeps nothing for later, so it needs no KV
cache and none of the paged backend's machinery: every token attends to every token of
its own sequence. The step's sequences arrive packed (``[tokens, ...]``, no padding);
the pooling engine orders them by length, so sequences of equal length sit next to each
other and each run of them is one ``[batch, heads, len, head]`` view of the packed rows.
One call of torch's ``scaled_dot_product_attention`` per run (its CPU flash kernel, in
the model dtype with float32 accumulation) then attends without a padded token or a
mask: a batch of 32 sequences of 128 tokens is one call per layer, and a mixed batch
costs one call per distinct length. A block-diagonal mask over the whole step would do
the same in one call, but its work grows with the square of the *step's* tokens rather
than the sum of the squares of each sequence's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class EncoderBatch:
    """The step's sequences as runs of equal length: ``(first row, sequences, length)``."""

    runs: tuple[tuple[int, int, int], ...]
    num_tokens: int

    @classmethod
    def from_lens(cls, lens: list[int]) -> EncoderBatch:
        runs: list[tuple[int, int, int]] = []
        row = 0
        for n in lens:
            if runs and runs[-1][2] == n:
                start, count, _ = runs[-1]
                runs[-1] = (start, count + 1, n)
            else:
                runs.append((row, 1, n))
            row += n
        return cls(tuple(runs), row)


@lru_cache(maxsize=4)
def band_mask(length: int, window: int) -> torch.Tensor:
    """``[length, length]``: True where two positions are at most ``window`` apart.

    Cached: every local layer of a step asks for the same few lengths. The caller
    must not modify the mask, and attention only reads it."""
    idx = torch.arange(length)
    return (idx[:, None] - idx[None, :]).abs() <= window


def bidirectional_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            batch: EncoderBatch, num_heads: int, scale: float,
                            window: int | None = None) -> torch.Tensor:
    """``q``/``k``/``v``: ``[tokens, heads * head]`` -> ``[tokens, heads * head]``.

    ``window``: a local layer's reach (ModernBERT): a token attends to tokens at most
    ``window`` positions away on either side. Runs no longer than ``window + 1``
    tokens are not masked, since every pair of their tokens is already in reach.
    """
    width = q.shape[1]
    head = width // num_heads
    outs = []
    for start, count, length in batch.runs:
        end = start + count * length

        def view(t: torch.Tensor, s: int = start, e: int = end, c: int = count,
                 n: int = length) -> torch.Tensor:
            return t[s:e].view(c, n, num_heads, head).transpose(1, 2)

        mask = band_mask(length, window) if window is not None and length > window + 1 \
            else None
        out = F.scaled_dot_product_attention(view(q), view(k), view(v), attn_mask=mask,
                                             scale=scale)
        outs.append(out.transpose(1, 2).reshape(count * length, width))
    return outs[0] if len(outs) == 1 else torch.cat(outs)
