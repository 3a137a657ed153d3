"""What the scheduler hands its front-door sessions: each session's output since the last
flush, and this replica's feed (cache changes and load, replica_feed) to every session.

One `Feed` per flush goes to every session, inside its output batch or alone; a session with
no output of its own still hears the feed (it routes on it). New provisional holds (a
submission's prompt blocks) go out on the next loop turn through `publish_soon`, not after
the step under way, since other front doors route on them.

Invariant: a request leaves `by_rid` exactly when its ended extra is flushed, and its
provisional hold is released then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from scheduler_service.request import Request
from scheduler_service.sessions.outbox import Batch
from scheduler_service.sessions.replica_feed import Feed, ReplicaFeed
from scheduler_service.state import SchedState

log = structlog.get_logger(__name__)

Sink = Callable[[Batch], None]  # one session's output of one flush


class SessionOutput:
    def __init__(self, feed: ReplicaFeed) -> None:
        self.feed = feed
        self.sinks: dict[str, Sink] = {}  # session id -> where its messages go
        self._publish_due = False  # a _publish_cache call is scheduled

    def flush(self, st: SchedState, by_rid: dict[str, Request], idle: bool = False) -> None:
        """Send every session its output since the last flush, with this flush's cache changes
        and load (the same `Feed` for every session); forget ended requests. `idle`: the loop
        is about to wait, so a load change is not held back by the rate limit."""
        feed = self.feed.collect(st, force_load=idle)
        fed: set[str] = set()
        for session, box in list(st.outboxes.items()):
            if not box:
                continue
            batch = box.drain()
            for ex in batch.extras:
                r = by_rid.pop(ex.rid, None) if ex.ended else None
                if r is not None:
                    log.debug(
                        "request_ended",
                        rid=ex.rid,
                        finish=ex.finish or "error",
                        error_code=ex.error_code,
                        output_tokens=len(r.output),
                    )
                    box.live.discard(ex.key)
                    self.feed.release(ex.rid)
            if not box.live:  # a later submit of this session opens a fresh outbox
                del st.outboxes[session]
            sink = self.sinks.get(session)
            if sink is not None:
                batch.feed = feed
                fed.add(session)
                sink(batch)
        if feed is not None:
            self._broadcast(feed, fed)

    def _broadcast(self, feed: Feed, skip: set[str] | frozenset[str] = frozenset()) -> None:
        """`feed` alone to every session not in `skip`."""
        for session, sink in list(self.sinks.items()):
            if session not in skip:
                sink(Batch([], [], [], feed))

    def submitted(self, req: Request) -> None:
        """`req` joined the queue: publish its prompt's blocks soon."""
        if self.feed.hold(req):
            self.publish_soon()

    def publish_soon(self) -> None:
        """Send new cache changes on the next loop turn (once per burst of submissions)."""
        if self._publish_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a unit test): the next flush carries them
            return
        self._publish_due = True
        loop.call_soon(self._publish_cache)

    def _publish_cache(self) -> None:
        self._publish_due = False
        feed = self.feed.collect_cache()
        if feed is not None:
            self._broadcast(feed)
