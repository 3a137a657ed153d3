"""A scheduler's grammar services: one link per address of `--grammar-address` (an address
spec, re-resolved while running), constrained requests spread over them.

- Each constrained request's matcher lives on one service, chosen when its bind is sent: the
  connected one with the fewest live matchers (`grammar_placement`). Compiles go to the least
  busy one too, and a bind prefers, among equally loaded services, the one that compiled its
  grammar.
- A mask step is split by owner, the parts go to their services concurrently, and the rows are
  gathered into one outcome; the step waits for the slowest part.
- A service that is lost (stream broken, or removed from the spec) gives its handles back: the
  scheduler re-binds them with replay (`on_lost`), and the next step places them on a connected
  service. A service that comes back, or is added, takes new binds. With none connected,
  constrained requests wait as they do for a single service (`up` is clear).

No grpc here: links come from `make_link` (`GrammarLink` in the service, fakes in unit tests).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from radixmesh_wire.mask_step_ops import MaskStepOutcome, MaskStepPlan
from scheduler_service.grammar.placement import Placement, gather
from scheduler_service.status import GrammarLost, GrammarUnavailable
from services.discovery import Discovery, Resolver, parse_address_spec, resolve_dns

log = structlog.get_logger(__name__)


class MaskLink(Protocol):
    """One grammar service as the pool needs it (see `grammar_link.GrammarLink`)."""

    address: str
    up: asyncio.Event
    on_up: Callable[[], None]
    on_down: Callable[[], None]

    async def run(self) -> None: ...

    async def close(self) -> None: ...

    async def compile(self, kind: str, text: str) -> tuple[bool, str]: ...

    def step(self, plan: MaskStepPlan) -> Awaitable[MaskStepOutcome]: ...


@dataclass
class Gathered:
    outcome: MaskStepOutcome
    # Wanted rows that got no answer: their service was lost (or none owned them). They must
    # not sample this step; their requests are re-bound with replay and wait for it.
    lost: list[int] = field(default_factory=list)


class GrammarPool:
    def __init__(
        self,
        spec: str,
        make_link: Callable[[str], MaskLink],
        interval_s: float = 5.0,
        resolver: Resolver = resolve_dns,
    ) -> None:
        self.spec = parse_address_spec(spec)  # ValueError at start-up for a bad spec
        self.make_link = make_link
        self.interval_s = interval_s
        self.resolver = resolver
        self.links: dict[str, MaskLink] = {}
        self.placement = Placement()
        self.up = asyncio.Event()  # at least one service is connected
        # Handles whose matchers were lost: the scheduler re-binds them with replay.
        self.on_lost: Callable[[list[int]], None] = lambda handles: None
        self.on_change: Callable[[], None] = lambda: None  # a service came or went
        self.rows_sent: Counter[str] = Counter()  # wanted rows per service (stats, load test)
        self.compiles: Counter[str] = Counter()  # compiles sent per service
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._sessions: Counter[str] = Counter()  # sessions opened per address
        self._compiling: Counter[str] = Counter()
        self._changed = asyncio.Event()

    # -- membership -----------------------------------------------------------------------------
    def connected(self) -> list[str]:
        return [a for a, link in self.links.items() if link.up.is_set()]

    async def run(self) -> None:
        """Follow the address spec until cancelled; then close every link."""
        try:
            watch = Discovery(self.spec, self.interval_s, self.resolver).watch()
            async for addresses in watch:
                await self.set_addresses(addresses)
            await asyncio.Event().wait()  # a fixed list: nothing more to watch
        finally:
            for address in list(self.links):
                await self._remove(address)

    async def set_addresses(self, addresses: list[str]) -> None:
        for address in addresses:
            if address not in self.links:
                self._add(address)
        for address in [a for a in self.links if a not in addresses]:
            await self._remove(address)
        log.info("grammar_services", addresses=sorted(self.links))

    def _add(self, address: str) -> None:
        link = self.make_link(address)
        link.on_up = lambda: self._link_up(address)
        link.on_down = lambda: self._link_down(address)
        self.links[address] = link
        self._tasks[address] = asyncio.create_task(link.run(), name=f"grammar-link {address}")

    async def _remove(self, address: str) -> None:
        link = self.links.pop(address)
        task = self._tasks.pop(address)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await link.close()
        self._link_down(address)

    def _link_up(self, address: str) -> None:
        self._sessions[address] += 1
        self.up.set()
        self._notify()

    def _link_down(self, address: str) -> None:
        handles = self.placement.drop(address)
        if not self.connected():
            self.up.clear()
        log.warning("grammar_service_lost", address=address, rebinding=len(handles))
        if handles:
            self.on_lost(handles)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        self.on_change()

    # -- compile --------------------------------------------------------------------------------
    async def compile(self, kind: str, text: str, wait_s: float = 30.0) -> tuple[bool, str]:
        """(ok, xgrammar's message) from the least busy connected service (live matchers plus
        compiles in flight; ties: fewest compiles sent, so compiles spread). A service that
        cannot be reached is skipped until a service comes or goes (or a second passes); with
        none left, keep trying for `wait_s`, then GrammarUnavailable."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        failed: dict[str, int] = {}  # address -> its session count when it failed
        last = "no grammar service is connected"
        while True:
            usable = [a for a in self.connected() if failed.get(a) != self._sessions[a]]
            if not usable:
                left = deadline - loop.time()
                if left <= 0:
                    raise GrammarUnavailable(f"{last} (waited {wait_s:g} s)")
                with contextlib.suppress(asyncio.TimeoutError):  # a service comes or goes
                    await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
                failed.clear()  # retry every service at least once a second
                continue
            live, busy, done = self.placement.live, self._compiling, self.compiles
            address = min(usable, key=lambda a: (live.get(a, 0) + busy[a], done[a], a))
            busy[address] += 1
            done[address] += 1
            try:
                ok, error = await self.links[address].compile(kind, text)
            except GrammarLost as exc:
                failed[address] = self._sessions[address]
                last = str(exc)
                continue
            finally:
                self._compiling[address] -= 1
            self.placement.compiled((kind, text), address)
            return ok, error

    # -- one mask step ----------------------------------------------------------------------------
    async def step(self, plan: MaskStepPlan) -> Gathered:
        """Send each service its part of `plan` concurrently and gather the rows."""
        split = self.placement.split(plan, self.connected())
        if split.unplaced:  # nothing connected: their requests are bound again later
            self.on_lost(split.unplaced)
        names = list(split.parts)
        results = await asyncio.gather(
            *(self.links[a].step(split.parts[a]) for a in names), return_exceptions=True
        )
        outcomes: list[MaskStepOutcome] = []
        lost = set(split.orphaned)
        for address, res in zip(names, results, strict=True):
            part = split.parts[address]
            if isinstance(res, GrammarUnavailable):
                lost.update(part.want)
                self._part_failed(address, res)
            elif isinstance(res, BaseException):
                raise res
            else:
                outcomes.append(res)
                self.rows_sent[address] += len(part.want)
        gathered = gather(plan.step_id, plan.want, outcomes)
        return Gathered(gathered, [h for h in plan.want if h in lost])

    def _part_failed(self, address: str, exc: GrammarUnavailable) -> None:
        link = self.links.get(address)
        still = link is not None and link.up.is_set()  # an unreadable reply, not a lost stream
        handles = self.placement.drop(address, still_connected=still)
        if handles:
            log.warning(
                "grammar_step_part_failed", address=address, rebinding=len(handles), error=str(exc)
            )
            self.on_lost(handles)
