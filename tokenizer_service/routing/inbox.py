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
- While the front door runs late (`Pacer.busy`), a plain update does not wake the waiting
  stream: its wake-up is handed to the pacer, which releases it at the next tick, so the tokens
  of the steps before the tick join the same event with ONE wake-up (before: a wake-up for the
  update, then another for the tick). An update with extras (a finish, an error, logprobs) or a
  rollback, and a lost link (an Exception), wake the stream at once, as before.

Invariant: the ids the stream takes, in order, with rollbacks applied, are exactly those put,
in order, with rollbacks applied (a merge only appends ids of a plain update to a plain one);
an update with extras is never merged, so what it carries stays with its own tokens.
"""

from __future__ import annotations

import asyncio

from tokenizer_service.pacing import Pacer
from tokenizer_service.routing.deltas import Update

Item = Update | Exception


class Inbox:
    __slots__ = ("items", "pacer", "_waiter", "_paced")

    def __init__(self, pacer: Pacer | None = None) -> None:
        self.items: list[Item] = []
        self.pacer = pacer  # set by the stream that takes from it (None: never paced)
        self._waiter: asyncio.Future[None] | None = None  # the stream's, while it waits
        self._paced = False  # the waiter's wake-up was handed to the pacer's next tick

    def put_nowait(self, item: Item) -> None:
        items = self.items
        plain = type(item) is Update and item.extras is None and not item.rollback
        if plain and items:
            last = items[-1]
            if type(last) is Update and last.extras is None:
                last.token_ids.extend(item.token_ids)  # type: ignore[union-attr]
                return  # the stream is already woken (or paced) for `last`
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
            if pacer is not None and pacer.busy:
                self._paced = True
                pacer.wake_at_tick(w)
            else:
                w.set_result(None)

    async def take(self) -> list[Item]:
        """Everything gathered, once there is something. While the front door runs late, a
        stream that finds only plain tokens waiting first waits for the pacer's tick, so that
        the next steps' tokens join them (see the module's docstring)."""
        if self.items:
            pacer = self.pacer
            if pacer is not None and pacer.busy and _plain_tail(self.items):
                await self._wait(paced=True)
        else:
            await self._wait(paced=False)
        items, self.items = self.items, []
        return items

    async def _wait(self, paced: bool) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter, self._paced = fut, paced
        if paced:
            assert self.pacer is not None
            self.pacer.wake_at_tick(fut)
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
            await self._wait(paced=False)
        return self.items.pop(0)


def _plain_tail(items: list[Item]) -> bool:
    """Only plain tokens waiting (whatever has extras is last: a finish or an error)."""
    last = items[-1]
    return type(last) is Update and last.extras is None
