"""Per-session output between two flushes, kept in the packed shape it travels in.

The hot path (each running request got a token) appends two ints to two lists, no object per
request per step: `keys[i]` names the request (its session key) of `events[i]`; an event >= 0
is a new output token, an event < 0 drops the last -event output tokens (jump-forward). Anything
else (logprobs, admission's cached tokens, prompt logprobs, finish, error) goes into an `Extra`
made only for the requests that have one. No protobuf here: links/frontend.py converts a `Batch`.

Invariant: within one session, no two requests that may still produce events share a key (the
front door assigns them), so `extras` can be keyed by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler_service.sessions.replica_feed import Feed


@dataclass(slots=True)
class Extra:
    """The rare part of what one request produced since the last flush."""

    key: int
    rid: str
    logprobs: list[tuple[int, float, list[int], list[float]]] = field(default_factory=list)
    finish: str = ""  # "", "stop", "length", "abort"
    matched_stop_token: int = -1
    cached_tokens: int = -1  # >= 0 on the first flush after admission
    prompt_logprobs: list[tuple[int, float]] = field(default_factory=list)
    error_code: int = 0
    error_message: str = ""

    @property
    def ended(self) -> bool:
        return bool(self.finish or self.error_code)


@dataclass(slots=True)
class Batch:
    """One flush's worth for one session: what a SchedulerMessage carries."""

    keys: list[int]
    events: list[int]
    extras: list[Extra]
    feed: Feed | None = None  # cache changes and load, the same for every session of a flush


class Outbox:
    """One front-door session's pending output. `live` holds the keys of the session's
    requests that can still produce output (submitted, not yet ended by a flushed finish or
    error): a submission under one of them is refused (submit_validation.check_unique)."""

    __slots__ = ("session", "keys", "events", "extras", "live")

    def __init__(self, session: str) -> None:
        self.session = session
        self.keys: list[int] = []
        self.events: list[int] = []
        self.extras: dict[int, Extra] = {}
        self.live: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self.keys or self.extras)

    def tokens(self, key: int, tokens: list[int]) -> None:
        self.keys.extend([key] * len(tokens))
        self.events.extend(tokens)

    def rollback(self, key: int, n: int) -> None:
        if n > 0:
            self.keys.append(key)
            self.events.append(-n)

    def extra(self, key: int, rid: str) -> Extra:
        ex = self.extras.get(key)
        if ex is None:
            ex = self.extras[key] = Extra(key, rid)
        return ex

    def drain(self) -> Batch:
        batch = Batch(self.keys, self.events, list(self.extras.values()))
        self.keys, self.events, self.extras = [], [], {}
        return batch


def error_batch(key: int, rid: str, code: int, message: str) -> Batch:
    """The whole output of a request refused before it reached the queue. The front door reads
    `error_code` as a gRPC status code (`Status` numbers are gRPC's)."""
    return Batch([], [], [Extra(key, rid, error_code=code, error_message=message)])
