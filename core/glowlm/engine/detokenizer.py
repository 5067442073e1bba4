"""Incremental detokenization: text deltas that never split a character.

The window trick: decode a few already-emitted tokens together with the new
ones and emit only the new suffix, so tokenizers whose pieces depend on their
neighbours (SentencePiece's leading space, byte-level BPE's partial UTF-8
sequences) produce the same text as one-shot decoding. A delta ending in the
replacement character is held back until the next token completes it.
"""

from __future__ import annotations

from typing import Any

#: Prompt tokens used as left context for the first output tokens.
_CONTEXT_TOKENS = 6


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int],
                 skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        context = prompt_token_ids[-_CONTEXT_TOKENS:]
        self.ids: list[int] = list(context)
        self.prefix_offset = 0
        self.read_offset = len(context)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip,
                                     clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes (possibly empty)."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Text still held back at the end of generation (an incomplete character)."""
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        self.read_offset = len(self.ids)
        self.prefix_offset = self.read_offset
        return full[len(prefix):] if len(full) > len(prefix) else ""
