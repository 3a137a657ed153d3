"""Per-request matcher state and the per-session table of them.

A `RequestMatcher` wraps one xgrammar `GrammarMatcher` plus the tail of the tokens it accepted
(the jump-forward retokenization needs their text) and how many of them xgrammar can still undo.
A `MatcherTable` maps a session's handles to matchers.

Invariants:
- A table is touched by one thread at a time: the server runs at most one step per session at
  once (the stream handler awaits each step before it reads the next message). No locks.
- The scheduler's token log is the truth. Binding with `replay` rebuilds the exact matcher
  state after a grammar-service restart: replay is just "accept these tokens" on a fresh matcher.
- A failed accept leaves the matcher after the last token it did accept (xgrammar's
  `accept_token` does not move on a rejected token), and the error says how many went in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import IntEnum

import numpy as np
import xgrammar as xgr

from grammar_service.kinds import GrammarKey


class ErrorCode(IntEnum):
    """Mirror of the proto enum `radixmesh.v1.GrammarErrorCode` (a unit test checks it)."""

    UNSPECIFIED = 0
    UNKNOWN_HANDLE = 1
    ALREADY_BOUND = 2
    COMPILE = 3
    TOKEN_REJECTED = 4
    ROLLBACK = 5
    INTERNAL = 6


class MatchError(Exception):
    def __init__(self, code: ErrorCode, message: str, accepted: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.accepted = accepted


class RequestMatcher:
    """One constrained request's grammar state.

    `history` keeps the last `keep` accepted tokens (a suffix of the request's output: enough for
    the retokenization window), `n_accepted` counts all of them, and `undoable` is how many may
    be rolled back now (all of them when `max_rollback_tokens` is -1).
    """

    __slots__ = ("key", "matcher", "history", "n_accepted", "undoable", "_max_rollback", "_keep")

    def __init__(
        self,
        key: GrammarKey,
        compiled: xgr.CompiledGrammar,
        *,
        max_rollback_tokens: int,
        keep_tokens: int,
    ) -> None:
        self.key = key
        # xgrammar 0.2.8 keeps every state (its max_rollback_tokens is deprecated); our bound
        # is a policy that also caps the token history we keep.
        self.matcher = xgr.GrammarMatcher(compiled)
        self.history: list[int] = []
        self.n_accepted = 0
        self.undoable = 0
        self._max_rollback = max_rollback_tokens
        self._keep = max(keep_tokens, max_rollback_tokens, 1)

    @property
    def terminated(self) -> bool:
        """A stop token was accepted: the only valid next tokens are stop tokens again."""
        return bool(self.matcher.is_terminated())

    def accept(self, tokens: Iterable[int]) -> None:
        """Accept tokens in order; on the first rejected one raise TOKEN_REJECTED with the
        number of tokens that did go in."""
        for done, tok in enumerate(tokens):
            t = int(tok)
            if not self.matcher.accept_token(t):
                why = "after the grammar terminated" if self.terminated else "by the grammar"
                raise MatchError(
                    ErrorCode.TOKEN_REJECTED,
                    f"token {t} rejected {why} (accepted {done} tokens of this batch first)",
                    accepted=done,
                )
            self.history.append(t)
            self.n_accepted += 1
            if self._max_rollback < 0 or self.undoable < self._max_rollback:
                self.undoable += 1
        if len(self.history) > 2 * self._keep:  # trim amortized: O(1) per token
            del self.history[: len(self.history) - self._keep]

    def rollback(self, n: int) -> None:
        if n < 0 or n > self.undoable:
            raise MatchError(
                ErrorCode.ROLLBACK,
                f"cannot roll back {n} tokens: {self.undoable} can be undone "
                f"(accepted {self.n_accepted}, max_rollback_tokens {self._max_rollback})",
            )
        if n == 0:
            return
        self.matcher.rollback(n)
        self.n_accepted -= n
        self.undoable -= n
        del self.history[max(0, len(self.history) - n) :]

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        """Write the next-token mask into `bitmask[row]` (int32 [rows, words], xgrammar layout).
        Must not be called when terminated (xgrammar refuses)."""
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def tail(self, n: int) -> list[int]:
        """The last min(n, len(history)) accepted tokens."""
        return self.history[-n:] if n > 0 else []


class MatcherTable:
    """All matchers of one session, by handle."""

    def __init__(self, *, max_rollback_tokens: int, keep_tokens: int) -> None:
        self._matchers: dict[int, RequestMatcher] = {}
        self._max_rollback = max_rollback_tokens
        self._keep = keep_tokens

    def bind(
        self,
        handle: int,
        key: GrammarKey,
        compiled: xgr.CompiledGrammar,
        replay: Sequence[int] = (),
    ) -> RequestMatcher:
        """Create the handle's matcher and replay tokens it accepted before. If a replayed token
        is rejected the matcher stays bound (after the accepted prefix) and MatchError says
        how far it got; the scheduler aborts and releases the request."""
        if handle in self._matchers:
            raise MatchError(ErrorCode.ALREADY_BOUND, f"handle {handle} is already bound")
        m = RequestMatcher(
            key, compiled, max_rollback_tokens=self._max_rollback, keep_tokens=self._keep
        )
        self._matchers[handle] = m
        if len(replay):
            m.accept(replay)
        return m

    def get(self, handle: int) -> RequestMatcher:
        m = self._matchers.get(handle)
        if m is None:
            raise MatchError(ErrorCode.UNKNOWN_HANDLE, f"handle {handle} is not bound")
        return m

    def release(self, handle: int) -> bool:
        """Forget a handle; releasing an unknown handle is a no-op (a failed bind, say)."""
        return self._matchers.pop(handle, None) is not None

    def clear(self) -> None:
        self._matchers.clear()

    def __len__(self) -> int:
        return len(self._matchers)

    def __contains__(self, handle: object) -> bool:
        return handle in self._matchers
