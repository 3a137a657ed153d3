"""The scheduler's face: what its links (the gRPC servicer in `links/frontend.py`) may ask of
it, in the spirit of vLLM v1's `SchedulerInterface`.

Everything a front-door session needs goes through these methods and frozen snapshots; none
of them hands out the scheduler's state, cache or queues, so the links cannot read or change
them behind the loop's back (tests/unit/test_scheduler_interface.py checks the links' code).
No protobuf here: the servicer converts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from scheduler_service.request import Request
from scheduler_service.sessions.output import Sink
from scheduler_service.sessions.replica_feed import Feed
from scheduler_service.stats import SchedulerSnapshot

__all__ = [
    "FlushOutcome",
    "SchedulerInterface",
    "SchedulerSnapshot",
    "SessionInUse",
    "SessionOpening",
    "Sink",
]


class SessionInUse(Exception):
    """A session id that is open on another stream (its output must not go to a second one)."""


@dataclass(frozen=True)
class SessionOpening:
    """What a front door learns when its session opens. `feed`: this replica's cache blocks
    and load at that instant; every later change reaches the session through its sink."""

    session_id: str
    kv_capacity: int  # 0 until the model service first connected
    context_length: int  # 0 until the model service first connected
    cache_block_tokens: int
    instance_id: str  # a restarted scheduler has another (its cache starts empty)
    feed: Feed


@dataclass(frozen=True)
class FlushOutcome:
    flushed: bool
    evicted_tokens: int = 0
    message: str = ""  # why not, when not flushed


class SchedulerInterface(Protocol):
    """What the links may call. Every method runs on the scheduler's event loop."""

    def open_session(self, session_id: str, sink: Sink) -> SessionOpening:
        """Register `sink` for the session's output (SessionInUse if the id is open)."""
        ...

    def close_session(self, session_id: str) -> None:
        """The stream ended: abort its requests and forget its sink."""
        ...

    def is_running(self, rid: str) -> bool:
        """Whether a request with this id is queued or running (its id cannot be reused)."""
        ...

    async def compile_grammar(self, kind: str, text: str) -> tuple[bool, str]:
        """Compile a constraint on a grammar service: (ok, error). GrammarUnavailable if no
        grammar service answers."""
        ...

    def submit(self, req: Request) -> None:
        """Queue a request (SubmitError, with a status and a message, if it cannot be)."""
        ...

    def abort(self, rid: str, session: str | None = None) -> bool:
        """Abort `rid` (only `session`'s own, when given); False if there is none."""
        ...

    def flush_cache(self) -> FlushOutcome:
        """Empty the prefix cache, only while nothing waits or runs."""
        ...

    def snapshot(self) -> SchedulerSnapshot | None:
        """Counters and KV pool now (None before the model service first connected)."""
        ...
