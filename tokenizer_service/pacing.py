"""Event pacing under load: while the front door's event loop runs late, streams send one event
per loop tick carrying every token that arrived meanwhile, instead of one event per token.

Why: the front door's cost is per event (a task wake-up, a frame, a socket write), not per
token. The scheduler sends one message per step with a token for every running request, and
the reader hands each message out before it reads the next, so a saturated front door would
still wake every stream once per token and fall further behind. When the loop's lag (how late a
periodic timer fires) exceeds `busy_s`, a stream that got an update first waits for the next
tick (`period_s`), so updates queue up and the stream drains them into one event. An idle
front door never waits: every token leaves as soon as it arrives, as before.
"""

from __future__ import annotations

import asyncio


class Pacer:
    def __init__(self, period_s: float = 0.01, busy_s: float = 0.005) -> None:
        self.period_s = period_s
        self.busy_s = busy_s
        self.lag = 0.0  # the latest tick's lateness (seconds)
        self._waiters: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        return self.lag > self.busy_s

    def start(self) -> None:
        """Idempotent; the monitor runs on the current loop until `stop`."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def next_tick(self) -> asyncio.Future[None]:
        """A future done at the next tick. Each waiter has its own, so that cancelling one
        stream (a client gone) never cancels the others' wait."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    def wake_at_tick(self, fut: asyncio.Future[None]) -> None:
        """Set `fut`'s result at the next tick (unless it is done by then): how an `Inbox`
        defers a stream's wake-up without a future of its own."""
        self._waiters.append(fut)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                t0 = loop.time()
                await asyncio.sleep(self.period_s)
                self.lag = max(loop.time() - t0 - self.period_s, 0.0)
                self._release()
        finally:
            self.lag = 0.0
            self._release()  # nobody waits for a tick that will never come

    def _release(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
