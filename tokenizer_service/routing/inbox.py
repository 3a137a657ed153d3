"""A request's updates on their way from its scheduler link to its stream: one hand-off per event.

The link reads one SchedulerMessage per step, with a token for every running request, and puts
each request's `Update` here; the request's stream (`core.FrontDoor._generate`) takes what has
gathered and turns it into ONE event. What an `asyncio.Queue` cost per update (a `get` per
item, a wake-up per put, and under load a second wake-up for the pacer's tick) is what this
saves:

- A plain token update (no extras, no rollback) put behind a plain one that the stream has not
  taken yet joins it (its ids appended): the stream gets one update per event, however many
  steps it missed, and applies (detokenizes, counts) it once.
- `take()` returns everything gathered, in one list.
- A plain update does not wake a stream that the pacer holds (tokenizer_service/pacing.py:
  the front door carries more streams than its event budget gives an event every tick, or its
  loop runs late): the stream's wake-up is handed to the pacer for the tick at which the stream
  may send again (`Pacer.due`: its last event's tick + the hold), so the tokens of the steps
  until then join ONE event with ONE wake-up. A stream's first event, an update with extras (a
  finish, an error, logprobs) or a rollback, and a lost link (an Exception), wake it at once.

Hold: `take()` leaves in `oldest` when the oldest update it returns arrived (perf_counter), so
the stream can measure how long the event budget kept a token in the front door
(`radixmesh_frontdoor_token_hold_seconds`).

Invariant: the ids the stream takes, in order, with rollbacks applied, are exactly those put,
in order, with rollbacks applied (a merge only appends ids of a plain update to a plain one);
an update with extras is never merged, so what it carries stays with its own tokens.
"""

from __future__ import annotations

import asyncio
from time import perf_counter

from tokenizer_service.pacing import Pacer
from tokenizer_service.routing.deltas import Update

Item = Update | Exception


class Inbox:
    __slots__ = ("items", "pacer", "oldest", "_since", "_waiter", "_paced", "_sent")

    def __init__(self, pacer: Pacer | None = None) -> None:
        self.items: list[Item] = []
        self.pacer = pacer  # set by the stream that takes from it (None: never paced)
        self._waiter: asyncio.Future[None] | None = None  # the stream's, while it waits
        self._paced = False  # the waiter's wake-up was handed to the pacer (a later tick)
        self._sent = -1  # the pacer's tick when the stream last took (-1: never)
        self._since = 0.0  # perf_counter when `items` last went from empty to not
        self.oldest = 0.0  # the same, for what the last `take()` returned

    def put_nowait(self, item: Item) -> None:
        items = self.items
        plain = type(item) is Update and item.extras is None and not item.rollback
        if plain and items:
            last = items[-1]
            if type(last) is Update and last.extras is None:
                last.token_ids.extend(item.token_ids)  # type: ignore[union-attr]
                return  # the stream is already woken (or paced) for `last`
        if not items:
            self._since = perf_counter()
        items.append(item)
        self._wake(plain)

    def put_token(self, token: int) -> None:
        """`put_nowait` of a plain update of one token, without building it when the last
        update waiting is plain (the link's common case: scheduler_link, live_requests)."""
        items = self.items
        if items:
            last = items[-1]
            if type(last) is Update and last.extras is None:
                last.token_ids.append(token)
                return
        else:
            self._since = perf_counter()
        u = Update()
        u.token_ids.append(token)
        items.append(u)
        self._wake(True)

    def _wake(self, plain: bool) -> None:
        w = self._waiter
        if w is None or w.done():
            return
        if not plain:
            w.set_result(None)  # a finish, an error or a lost link goes at once
        elif not self._paced:
            pacer = self.pacer
            due = pacer.due(self._sent) if pacer is not None else 0
            if due:
                assert pacer is not None
                self._paced = True
                pacer.wake_at(w, due)
            else:
                w.set_result(None)

    async def take(self) -> list[Item]:
        """Everything gathered, once there is something. A stream that the pacer holds and
        that finds only plain tokens waiting first waits for the tick at which it may send
        again, so that the next steps' tokens join them (see the module's docstring)."""
        pacer = self.pacer
        if self.items:
            if pacer is not None and _plain_tail(self.items):
                due = pacer.due(self._sent)
                if due:
                    await self._wait(due)
        else:
            await self._wait(0)  # the update that wakes it is paced by `_wake`
        items, self.items = self.items, []
        self.oldest = self._since
        if pacer is not None:
            if self._sent < 0:  # its first event: a live stream for the pacer until `close`
                pacer.streams += 1
            self._sent = pacer.tick
        return items

    def close(self) -> None:
        """The stream is done (finished, failed or gone): it no longer counts as live. A
        request that never got its first event (queued at its scheduler) never counted: it
        sends no events."""
        if self.pacer is not None and self._sent >= 0:
            self.pacer.streams -= 1
        self._sent = -1

    async def _wait(self, due: int) -> None:
        """Wait for `_wake`, or (due > 0) for the pacer's tick `due` at the latest."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter, self._paced = fut, due > 0
        if due:
            assert self.pacer is not None
            self.pacer.wake_at(fut, due)
        try:
            await fut
        finally:
            self._waiter, self._paced = None, False

    # asyncio.Queue's calls that the link's callers and tests use (one item at a time)

    def qsize(self) -> int:
        return len(self.items)

    def empty(self) -> bool:
        return not self.items

    def get_nowait(self) -> Item:
        if not self.items:
            raise asyncio.QueueEmpty
        return self.items.pop(0)

    async def get(self) -> Item:
        while not self.items:
            await self._wait(0)
        return self.items.pop(0)


def _plain_tail(items: list[Item]) -> bool:
    """Only plain tokens waiting (whatever has extras is last: a finish or an error)."""
    last = items[-1]
    return type(last) is Update and last.extras is None
