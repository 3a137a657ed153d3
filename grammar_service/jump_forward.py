"""Jump-forward proposals: the grammar's forced continuation, retokenized (paper appendix B.2).

When the grammar admits exactly one continuation string, the scheduler can append it in one
forward pass instead of decoding it token by token. String and token boundaries differ, so the
paper retokenizes the text around the boundary. The scheduler holds token ids only (the
tokenizer lives in the front door), so the grammar service, which has the tokenizer anyway,
proposes the token form: "drop your last `rollback` tokens, append `tokens`".

How the forced bytes are found (`ForcedBytes`), bounded in length and time:
xgrammar's own `find_jump_forward_string` walks until the continuation branches, with no bound:
a grammar whose forced continuation never ends (a schema whose objects require themselves)
grows its state until the host runs out of memory, in native code nothing can interrupt. It
also returns `str`, which fails on a forced string that ends inside a multibyte character. So
we walk ourselves, on a fork of the matcher, from masks: every continuation starts with an
allowed token, so the longest common byte prefix of the allowed tokens is forced; accept it on
the fork and repeat until the allowed tokens disagree, a stop token is allowed, or the bounds
(`max_bytes`, and `max_steps` mask fills, which bounds the time) are reached. The bounds are
counts, not a clock, so a proposal never depends on load: the same request jumps the same way
alone or in a batch. The masks are exact and the vocabulary byte-level, so
this finds what xgrammar's character walk finds, up to the bounds. A truncated walk is still a
correct (shorter) forced prefix.

How a proposal is made:
1. Take the request's last `window` accepted tokens (fewer if the matcher cannot undo that
   many), dropped from the left until they start on a character boundary.
2. Window bytes + forced bytes, cut after the last whole UTF-8 character (a token may end
   inside a character, and the forced bytes may too): that text is encoded; the common prefix
   with the window's tokens is kept, the rest of the window is rolled back and the rest of the
   encoding appended.
3. Check: the new tokens' bytes must equal the cut bytes (tokenizers that add a prefix space
   fail this), and a fork of the matcher, rolled back, must accept every new token.
   A failed check yields the text with no tokens (the scheduler then decodes normally).

The proposal is never applied here: the scheduler applies it (Truncate+Extend to the model,
Rollback+accept to us), which keeps its token log the single source of truth.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xgrammar as xgr

from grammar_service.matchers import RequestMatcher
from radixmesh_wire.mask_rows import bitmask_words

_I32 = np.dtype("<i4")


@dataclass(frozen=True, slots=True)
class JumpProposal:
    """`text`: the forced continuation (bytes of a partial character at its edges shown as
    U+FFFD); `rollback`/`tokens`: the checked token form, empty when none was found."""

    text: str
    rollback: int = 0
    tokens: list[int] = field(default_factory=list)


def whole_chars(data: bytes) -> int:
    """Length of the longest prefix of `data` that is whole UTF-8 characters."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return int(exc.start)
    return len(data)


class ForcedBytes:
    """The bounded forced-continuation walk (see the module docstring)."""

    def __init__(
        self,
        token_bytes: Sequence[bytes],
        vocab_size: int,
        stop_token_ids: Sequence[int],
        *,
        max_bytes: int = 512,
        max_steps: int = 64,
    ) -> None:
        self._token_bytes = token_bytes
        self.vocab_size = vocab_size
        self.max_bytes = max_bytes
        self.max_steps = max_steps
        self._stops = np.asarray(sorted(set(stop_token_ids)), dtype=np.int64)
        # First byte of every token, -1 for tokens without bytes (special tokens): one
        # vectorised comparison answers "do the allowed tokens agree on the next byte?".
        first = np.full(vocab_size, -1, dtype=np.int16)
        for i, b in enumerate(token_bytes[:vocab_size]):
            if b:
                first[i] = b[0]
        self._first = first
        self._row = np.zeros((1, bitmask_words(vocab_size)), dtype=_I32)

    def _allowed(self, row: np.ndarray) -> np.ndarray:
        bits = np.unpackbits(row.view(np.uint8), bitorder="little", count=self.vocab_size)
        return np.flatnonzero(bits)

    def walk(self, matcher: xgr.GrammarMatcher, first_row: np.ndarray | None = None) -> bytes:
        """The forced bytes after `matcher`'s state (b"" when nothing is forced). `first_row`:
        the state's mask if already filled (int32 words). Does not change `matcher`."""
        out = b""
        fills = 0
        probe: xgr.GrammarMatcher | None = None
        row = first_row
        while len(out) < self.max_bytes:
            if row is None:
                if fills >= self.max_steps:
                    break
                fills += 1
                if probe is None:
                    probe = matcher.fork()
                    if out and not probe.accept_string(out):
                        return b""  # cannot happen for bytes the masks forced
                probe.fill_next_token_bitmask(self._row, 0)
                row = self._row[0]
            allowed = self._allowed(row)
            row = None
            if allowed.size == 0 or np.isin(self._stops, allowed).any():
                break  # nothing allowed, or the grammar may end here: nothing is forced
            firsts = self._first[allowed]
            if firsts[0] < 0 or (firsts != firsts[0]).any():
                break
            common = os.path.commonprefix([self._token_bytes[i] for i in allowed.tolist()])
            step = common[: self.max_bytes - len(out)]
            if probe is not None and not probe.accept_string(step):
                break
            out += step
        return out


class Retokenizer:
    def __init__(
        self, tokenizer: Any, token_bytes: Sequence[bytes], forced: ForcedBytes, window: int = 8
    ) -> None:
        """`tokenizer`: a Hugging Face tokenizer; `token_bytes[id]`: the exact bytes of each
        token (xgrammar's `TokenizerInfo.decoded_vocab`)."""
        self._token_bytes = token_bytes
        self.forced = forced
        self.window = max(0, window)
        # Why the backend: its encode neither mutates tokenizer state nor adds special tokens,
        # so concurrent sessions' threads may call it at once.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            self._encode = lambda text: list(backend.encode(text, add_special_tokens=False).ids)
        else:
            self._encode = lambda text: list(tokenizer.encode(text, add_special_tokens=False))

    def _bytes(self, ids: Sequence[int]) -> bytes:
        vocab = self._token_bytes
        return b"".join(vocab[i] if 0 <= i < len(vocab) else b"\x00\xff" for i in ids)

    def propose(
        self, m: RequestMatcher, first_row: np.ndarray | None = None
    ) -> JumpProposal | None:
        """None when the grammar forces nothing; otherwise the forced text and, when checks
        pass, the token form. Does not change `m`."""
        if m.terminated:
            return None
        forced = self.forced.walk(m.matcher, first_row)
        if not forced:
            return None
        text = forced.decode("utf-8", errors="replace")
        window = m.tail(min(self.window, m.undoable))
        head = self._bytes(window)
        while window and 0x80 <= head[0] < 0xC0:  # starts inside a character: drop left
            window = window[1:]
            head = self._bytes(window)
        whole = head + forced
        whole = whole[: whole_chars(whole)]
        if len(whole) <= len(head):
            return JumpProposal(text)  # the forced bytes complete no character yet
        ids = self._encode(whole.decode("utf-8"))
        if self._bytes(ids) != whole:
            return JumpProposal(text)
        keep = 0
        while keep < min(len(ids), len(window)) and ids[keep] == window[keep]:
            keep += 1
        rollback, tokens = len(window) - keep, ids[keep:]
        if not tokens or not self._accepts(m, rollback, tokens):
            return JumpProposal(text)
        return JumpProposal(text, rollback, tokens)

    @staticmethod
    def _accepts(m: RequestMatcher, rollback: int, tokens: Sequence[int]) -> bool:
        probe = m.matcher.fork()
        if rollback:
            probe.rollback(rollback)
        return all(probe.accept_token(t) for t in tokens)
