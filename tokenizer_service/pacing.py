"""Event pacing: how often a stream may send an event, so that a front door carrying many streams
sends few, full events instead of one per token (issue 27).

Why: the front door's cost is per event (a wake-up, a frame, a socket write), not per token.
The scheduler sends one message per step with a token for every running request, so without
pacing every stream costs one event per step, and a front door with a thousand streams spends
its core on events. A stream's tokens gather in its inbox (routing/inbox.py) while it is held;
the held stream then sends them as ONE event.

The rule, decided once per tick (`period_s`, 10 ms) from the front door's own state:

- **An event budget** (`events_per_s`, `--pacing-events-per-s`): the front door may send about
  this many events a second, shared evenly by its live streams (those that have sent their
  first event and not ended: a request queued at its scheduler sends none). With `streams`
  live, a stream's plain token events are at least `hold` ticks apart, hold = streams /
  (events_per_s x period_s) ticks, rounded down, at most `max_hold_ticks`
  (`--pacing-max-hold-ms`). Below
  events_per_s x period_s streams (160 by default) hold is 0: no stream waits. The budget is
  the front door's CPU for events (16,000 events/s at ~35 us each is ~0.6 of a core), so at
  1,024 streams a stream sends an event every 6 ticks (60 ms) with every token since its last.
- **The loop's lag** (`busy_s`): while the latest tick fired more than busy_s late, a stream
  that got a token waits at least for the next tick (the rule before the budget).
- **Never held**: a stream's first event (time to first token), and anything that is not a plain
  token: a finish, an error, logprobs, a rollback, a lost link.

Ticks are counted (`tick`); a stream that sent an event at tick t sends its next plain event at
tick t + hold or later. A late loop fires its ticks late, so the hold only grows with the
lateness it answers. `advance` is one tick; the monitor task calls it every period_s, tests call
it themselves (`manual=True`) to drive the rule without a clock.
"""

from __future__ import annotations

import asyncio


class Pacer:
    def __init__(
        self,
        period_s: float = 0.01,
        busy_s: float = 0.005,
        events_per_s: float = 16000.0,
        max_hold_s: float = 0.06,
        manual: bool = False,
    ) -> None:
        if period_s <= 0 or events_per_s < 0 or max_hold_s < 0:
            raise ValueError("pacing: period_s must be > 0, events_per_s and max_hold_s >= 0")
        self.period_s = period_s
        self.busy_s = busy_s
        self.events_per_s = events_per_s  # 0: no budget (the lag rule alone)
        self.max_hold_ticks = int(max_hold_s / period_s + 1e-9)
        self.manual = manual  # no monitor task: the caller ticks (`advance`)
        self.lag = 0.0  # the latest tick's lateness (seconds)
        self.tick = 0  # ticks so far
        self.hold = 0  # ticks between a stream's plain events, from the live streams
        self.streams = 0  # live streams: from their first event to their end (Inbox counts)
        self._due: dict[int, list[asyncio.Future[None]]] = {}  # tick -> futures to release
        self._task: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        return self.lag > self.busy_s

    def start(self) -> None:
        """Idempotent; the monitor runs on the current loop until `stop`."""
        if self.manual:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._release_all()  # nobody waits for a tick that will never come

    def due(self, sent: int) -> int:
        """The tick at which a stream whose last event left at tick `sent` (-1: none yet) may
        send its next plain event; 0: now."""
        if sent < 0:
            return 0  # the first token goes at once
        due = sent + self.hold if self.hold else 0
        if self.busy:
            due = max(due, self.tick + 1)
        return due if due > self.tick else 0

    def wake_at(self, fut: asyncio.Future[None], tick: int) -> None:
        """Set `fut`'s result at tick `tick` (> the current tick) unless it is done by then
        (woken early by a finish, or cancelled). Each waiter has its own future, so that
        cancelling one stream never cancels the others' wait."""
        self._due.setdefault(max(tick, self.tick + 1), []).append(fut)

    def advance(self, lag: float = 0.0) -> None:
        """One tick that fired `lag` seconds late: decide the hold from the live streams and
        release the futures due."""
        self.lag = lag
        self.tick += 1
        self.hold = self.hold_for(self.streams)
        waiters = self._due.pop(self.tick, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def hold_for(self, streams: int) -> int:
        """Ticks between a stream's plain events with `streams` live (see the module's doc)."""
        if not self.events_per_s:
            return 0
        return min(int(streams / (self.events_per_s * self.period_s)), self.max_hold_ticks)

    def waiting(self) -> int:
        """Futures held for a later tick and not done (tests: a cancelled stream leaves none)."""
        return sum(1 for futs in self._due.values() for f in futs if not f.done())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                t0 = loop.time()
                await asyncio.sleep(self.period_s)
                self.advance(max(loop.time() - t0 - self.period_s, 0.0))
        finally:
            self.lag = 0.0
            self._release_all()

    def _release_all(self) -> None:
        due, self._due = self._due, {}
        for futs in due.values():
            for fut in futs:
                if not fut.done():
                    fut.set_result(None)
