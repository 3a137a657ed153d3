"""Liveness that tells the truth: a watchdog on loop progress.

A service registers the loops it depends on. `Progress` is one loop's heartbeat: `begin()` /
`end()` bracket a unit of work (a scheduler iteration, a model step), `beat()` marks progress
inside one. A loop with work under way that has not progressed for `stall_s` is stuck; a task
that must run forever and ended (an exception escaped it) is dead. Either turns the service's
liveness NOT_SERVING with the reason, so the launcher (or Kubernetes) restarts it. A loop that is
merely idle (no work) is never stuck. Progress objects are updated from any thread (plain
attribute writes); the check runs on the event loop, so a blocked event loop shows up as health
checks that go unanswered, which the launcher's probe treats the same way.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)


class _Liveness(Protocol):
    async def set_live(self, live: bool, reason: str = "") -> None: ...


class Progress:
    """Invariant: `active` counts units of work begun and not ended; `last` is the time of the
    latest begin (from idle), beat or end."""

    def __init__(self, name: str, stall_s: float) -> None:
        self.name = name
        self.stall_s = stall_s
        self.active = 0
        self.last = time.monotonic()
        self._lock = threading.Lock()

    def begin(self) -> None:
        with self._lock:
            if self.active == 0:
                self.last = time.monotonic()
            self.active += 1

    def end(self) -> None:
        with self._lock:
            self.active = max(self.active - 1, 0)
            self.last = time.monotonic()

    def beat(self) -> None:
        self.last = time.monotonic()

    def stalled(self, now: float) -> str | None:
        quiet = now - self.last
        if self.active > 0 and quiet > self.stall_s:
            return f"{self.name} made no progress for {quiet:.0f} s (limit {self.stall_s:g} s)"
        return None


class Watchdog:
    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.loops: list[Progress] = []
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def progress(self, name: str, stall_s: float) -> Progress:
        p = Progress(name, stall_s)
        self.loops.append(p)
        return p

    def task(self, name: str, task: asyncio.Task[None]) -> None:
        """`task` must run until shutdown: its end means the service is dead."""
        self.tasks[name] = task

    def problem(self, now: float) -> str | None:
        for name, t in self.tasks.items():
            if t.done() and not t.cancelled():
                exc = t.exception()
                return f"{name} ended: {exc!r}" if exc else f"{name} ended"
        for p in self.loops:
            if (why := p.stalled(now)) is not None:
                return why
        return None

    async def run(self, health: _Liveness) -> None:
        bad: str | None = None
        while True:
            await asyncio.sleep(self.interval_s)
            why = self.problem(time.monotonic())
            if why != bad:
                if why:
                    log.error("watchdog", problem=why)
                else:
                    log.info("watchdog_recovered", previous=bad)
                await health.set_live(why is None, why or "progressing")
                bad = why
