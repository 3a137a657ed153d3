"""Incremental detokenization, correct for byte-level BPE and multi-byte UTF-8.

A token may end in the middle of a UTF-8 character (the decoder then yields U+FFFD), and
tokenizers that strip a leading space decode a lone token differently than in context. So we
decode a short window that starts a few tokens back (`prefix_offset`) and emit only what that
window adds beyond its already-emitted part, holding text back while it ends in U+FFFD.
Invariant: the concatenation of every `push` result and `flush()` equals decode(all ids).
The detokenizer keeps no text itself: the caller owns the text (a copy of the whole text per
push was a cost per event that grew with the output, issue 27).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[Sequence[int]], str]
_CONTEXT = 5  # tokens of left context kept in the window


class IncrementalDetokenizer:
    def __init__(self, decode: Decode, prompt_tail: Sequence[int] = ()) -> None:
        self.decode = decode
        self.ids: list[int] = list(prompt_tail[-_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def push(self, new_ids: Sequence[int]) -> str:
        if not new_ids:
            return ""
        self.ids.extend(new_ids)
        before = self.decode(self.ids[self.prefix_offset : self.read_offset])
        after = self.decode(self.ids[self.prefix_offset :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # incomplete character: wait for the next token
        delta = after[len(before) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return delta

    def flush(self) -> str:
        """At the end: whatever is held back (a final incomplete character decodes as U+FFFD)."""
        before = self.decode(self.ids[self.prefix_offset : self.read_offset])
        after = self.decode(self.ids[self.prefix_offset :])
        delta = after[len(before) :] if len(after) > len(before) else ""
        self.read_offset = len(self.ids)
        return delta
