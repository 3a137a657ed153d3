"""The front door's replicas: one `SchedulerLink` per scheduler address, routing, failover.

Addresses come from `--scheduler-address` (services.discovery: a list, a DNS name or a
file, re-read every `--resolve-interval-s`). A replica that appears gets a link and traffic; one
that disappears is drained: it gets no new requests, its live ones finish, then its link
closes (an address that comes back before that simply stops draining).

Each request is routed once, by the policy (tokenizer_service.routing.router) over the views of the
replicas that can serve it (session up and the scheduler's readiness SERVING, i.e. its model
is connected; see `_candidates`). Its `Ticket` is the front door's handle: the request id's
(link, key) on the replica it runs on now. When a replica's link goes down, or its model does,
and another replica can serve, its live requests move at once (routed again among those) as
continuations: the same queue, so the client stream sees a pause and then the tokens that
follow; greedy and seeded requests give the same tokens as if nothing happened. With no replica
able to serve they stay held on their link as with one scheduler (bounded by
`--scheduler-hold-s`), and move to the first replica that can.

Invariants: a request id is live on at most one link (`tickets` maps it to where it runs);
a ticket's link and key change only in `_move`, together with the link tables.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass, field

import structlog

from radixmesh_wire.cache_blocks import BLOCK_TOKENS, block_hashes, cache_keys
from radixmesh_wire.pb import scheduler_pb2
from services.discovery import (
    AddressSpec,
    Discovery,
    Resolver,
    parse_address_spec,
    resolve_dns,
)
from services.server import Health
from tokenizer_service.config import TokenizerConfig
from tokenizer_service.routing.inbox import Inbox
from tokenizer_service.routing.live_requests import LiveRequest
from tokenizer_service.routing.router import (
    Balance,
    Candidate,
    Decision,
    Policy,
    Router,
    prompt_key,
)
from tokenizer_service.routing.scheduler_link import DuplicateRequest, SchedulerLink, SchedulerLost

log = structlog.get_logger(__name__)


@dataclass
class Ticket:
    rid: str
    link: SchedulerLink
    key: int
    queue: Inbox  # the request's updates (routing/inbox.py)
    hashes: list[int]  # the prompt's block hashes (cache_aware routing only)
    route_key: int  # its rendezvous key
    cost: int  # tokens it adds to a replica's load: prompt + generation budget


@dataclass
class RouteCounts:
    """What this front door sent to one replica."""

    by_reason: Counter[str] = field(default_factory=Counter)
    moved_in: int = 0  # requests that came here from a replica that went down


class ReplicaSet:
    def __init__(
        self,
        spec: AddressSpec,
        router: Router | None = None,
        hold_s: float = 60.0,
        block_cap: int = 65536,
        interval_s: float = 5.0,
        resolver: Resolver = resolve_dns,
        start_links: bool = True,
    ) -> None:
        """`start_links=False`: links are created but not run (unit tests drive them)."""
        self.spec = spec
        self.start_links = start_links
        self.router = router or Router()
        self.hold_s = hold_s
        self.block_cap = block_cap
        self.interval_s = interval_s
        self.resolver = resolver
        self.links: dict[str, SchedulerLink] = {}
        self.tickets: dict[str, Ticket] = {}
        self.counts: dict[str, RouteCounts] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._health: Health | None = None
        self._closing: set[asyncio.Task[None]] = set()  # drained links being closed

    @classmethod
    def from_config(cls, cfg: TokenizerConfig) -> ReplicaSet:
        """Raises ValueError naming the flag that is wrong."""
        if cfg.balance_abs_tokens < 0 or cfg.balance_abs_requests < 0 or cfg.balance_rel < 1.0:
            raise ValueError(
                "--balance-abs-tokens and --balance-abs-requests must be >= 0, --balance-rel >= 1"
            )
        if not (cfg.balance_share == 0 or cfg.balance_share >= 1.0) or cfg.balance_window < 1:
            raise ValueError("--balance-share must be 0 (off) or >= 1, --balance-window >= 1")
        if cfg.resolve_interval_s <= 0 or cfg.approx_cache_blocks < 1:
            raise ValueError("--resolve-interval-s and --approx-cache-blocks must be positive")
        if not 0.0 <= cfg.cache_threshold <= 1.0:
            raise ValueError("--cache-threshold must be between 0 and 1")
        try:
            spec = parse_address_spec(cfg.scheduler_address)
        except ValueError as exc:
            raise ValueError(f"--scheduler-address: {exc}") from None
        balance = Balance(
            cfg.balance_abs_tokens,
            cfg.balance_rel,
            cfg.balance_abs_requests,
            cfg.balance_share,
            cfg.balance_window,
        )
        router = Router(Policy(cfg.router), balance, cfg.cache_threshold)
        return cls(
            spec,
            router,
            hold_s=cfg.scheduler_hold_s,
            block_cap=cfg.approx_cache_blocks,
            interval_s=cfg.resolve_interval_s,
        )

    # --- membership

    async def run(self, health: Health) -> None:
        """Follow the address spec forever (the front door's background task)."""
        self._health = health
        await self._set_ready()
        try:
            async for addresses in Discovery(self.spec, self.interval_s, self.resolver).watch():
                await self.update(addresses)
            await asyncio.Event().wait()  # a fixed list: nothing more to watch
        finally:
            for task in self._tasks.values():
                task.cancel()

    async def update(self, addresses: list[str]) -> None:
        """The replica addresses now: start links for new ones, drain the missing ones."""
        wanted = set(addresses)
        for address in addresses:
            link = self.links.get(address)
            if link is None:
                self.add(address)
            elif link.draining:
                link.draining = False
                log.info("replica_back", replica=address)
        for address, link in list(self.links.items()):
            if address not in wanted and not link.draining:
                link.draining = True
                log.info("replica_draining", replica=address, live=len(link.live))
                await self._close_if_drained(link)
        log.info("replicas", addresses=sorted(wanted), links=len(self.links))

    def add(self, address: str) -> SchedulerLink:
        link = SchedulerLink(address, self.hold_s, self.block_cap)
        link.on_state = self._on_state
        self.links[address] = link
        self.counts.setdefault(address, RouteCounts())
        if self.start_links:
            self._tasks[address] = asyncio.create_task(link.run(), name=f"link-{address}")
        log.info("replica_added", replica=address)
        return link

    async def _close_if_drained(self, link: SchedulerLink) -> None:
        if not link.draining or len(link.live):
            return
        self.links.pop(link.address, None)
        task = self._tasks.pop(link.address, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await link.close()
        log.info("replica_removed", replica=link.address)
        await self._set_ready()

    # --- state

    @property
    def ready(self) -> bool:
        return any(lk.connected.is_set() for lk in self.links.values())

    @property
    def context_length(self) -> int:
        """The model's context window as a connected replica last told it (else any replica
        seen before); 0 while no replica has reported a connected model. Every replica serves
        the same model, so their windows agree."""
        told = [lk for lk in self.links.values() if lk.context_length]
        told.sort(key=lambda lk: not lk.connected.is_set())
        return told[0].context_length if told else 0

    @property
    def inflight(self) -> int:
        return len(self.tickets)

    def _candidates(self, exclude: SchedulerLink | None = None) -> list[SchedulerLink]:
        """Where a request may go now, best first: replicas connected and serving (their model
        is up) that are not draining; then serving ones that drain; then connected ones
        (they hold work until their model is back); with none connected, the ones still
        within their hold bound (the request is held on the link)."""
        links = [lk for lk in self.links.values() if lk is not exclude]
        up = [lk for lk in links if lk.connected.is_set()]
        for pool in (
            [lk for lk in up if lk.serving and not lk.draining],
            [lk for lk in up if lk.serving],
            [lk for lk in up if not lk.draining],
            up,
        ):
            if pool:
                return pool
        return [lk for lk in links if not lk.draining and not lk.refusing]

    def _route(self, pool: list[SchedulerLink], hashes: list[int], key: int) -> Decision:
        return self.router.choose([Candidate(lk.address, lk.view) for lk in pool], hashes, key)

    # --- requests

    def submit(self, msg: scheduler_pb2.SubmitRequest) -> Ticket:
        """Route and send a request (or hold it while no replica is connected); raises
        SchedulerLost when no replica can take it, DuplicateRequest for a running id."""
        if msg.rid in self.tickets:
            raise DuplicateRequest(f"request {msg.rid!r} is running: use another request_id")
        pool = self._candidates()
        if not pool:
            raise SchedulerLost(self._why_none())
        hashes: list[int] = []
        if self.router.policy is Policy.CACHE_AWARE:
            hashes = block_hashes(cache_keys(msg.input_ids, msg.cache_namespace))
        route_key = prompt_key(hashes, msg.input_ids)
        decision = self._route(pool, hashes, route_key)
        link = self.links[decision.address]
        queue = link.submit(msg)
        # The work it adds there: the prompt part the replica does not hold, plus its budget
        # (a cache hit costs little; charging the whole prompt made the balance rule push a
        # group's later requests off the replica that holds their prefix).
        held = decision.matched_blocks * BLOCK_TOKENS
        cost = max(len(msg.input_ids) - held, 1) + msg.sampling.max_new_tokens
        ticket = Ticket(msg.rid, link, msg.key, queue, hashes, route_key, cost)
        self.tickets[msg.rid] = ticket
        link.view.on_routed(hashes, cost)
        self.counts[link.address].by_reason[decision.reason] += 1
        log.debug(
            "routed",
            replica=link.address,
            reason=decision.reason,
            matched_blocks=decision.matched_blocks,
            host_blocks=decision.host_blocks,
        )
        return ticket

    def _why_none(self) -> str:
        if not self.links:
            return "no scheduler replica is known yet (--scheduler-address resolved to none)"
        return (
            f"no scheduler replica has been reachable for the last {self.hold_s:g} s; retry later"
        )

    def abort(self, ticket: Ticket) -> None:
        """Stop delivering to the request and tell its replica to drop it."""
        ticket.link.abort(ticket.rid, ticket.key)

    def request_abort(self, rid: str) -> bool:
        """Client-initiated abort: the request's own stream still receives its final update."""
        ticket = self.tickets.get(rid)
        return ticket is not None and ticket.link.request_abort(rid)

    def done(self, ticket: Ticket) -> None:
        """The request's stream ended: forget it (and close its replica if that was draining
        and this was its last request)."""
        ticket.link.done(ticket.rid, ticket.key)
        if self.tickets.get(ticket.rid) is ticket:
            del self.tickets[ticket.rid]
            ticket.link.view.on_finished(ticket.cost)
        self._close_soon(ticket.link)

    def _close_soon(self, link: SchedulerLink) -> None:
        """Close a draining replica's link once its last request has left it."""
        if link.draining and not len(link.live):
            task = asyncio.get_running_loop().create_task(self._close_if_drained(link))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def end_all(self, reason: str) -> None:
        """Shutdown: every live request ends now with UNAVAILABLE and `reason`."""
        for link in self.links.values():
            link.end_all(reason)
        self.tickets.clear()

    # --- failover

    async def _on_state(self, link: SchedulerLink) -> None:
        if _usable(link):  # up: take over requests held on replicas that cannot serve
            for other in list(self.links.values()):
                if other is not link and not _usable(other):
                    self._move_all(other)
        else:
            self._move_all(link)
        await self._set_ready()

    def _move_all(self, source: SchedulerLink) -> None:
        """Move the unfinished requests of a replica that is down (or whose model is) to
        replicas that can serve them now; with none, they stay where they are held."""
        targets = [lk for lk in self._candidates(exclude=source) if _usable(lk)]
        if not targets or not len(source.live):
            return
        moving = source.take_unfinished()
        for live in moving:
            self._move(live, source, targets)
        self._close_soon(source)
        log.warning("replica_failover", replica=source.address, moved=len(moving), to=len(targets))

    def _move(self, live: LiveRequest, source: SchedulerLink, targets: list[SchedulerLink]) -> None:
        rid = live.submit.rid
        ticket = self.tickets.get(rid)
        if ticket is None:  # not routed by us (cannot happen): keep it on a target anyway
            self.links[targets[0].address].adopt(live)
            return
        decision = self._route(targets, ticket.hashes, ticket.route_key)
        target = self.links[decision.address]
        ticket.key = target.adopt(live)
        ticket.link = target
        source.view.on_finished(ticket.cost)
        target.view.on_routed(ticket.hashes, ticket.cost)
        self.counts[target.address].moved_in += 1

    async def _set_ready(self) -> None:
        if self._health is None:
            return
        n = sum(lk.connected.is_set() for lk in self.links.values())
        reason = f"{n} of {len(self.links)} scheduler replicas connected"
        await self._health.set_ready(n > 0, reason)


def _usable(link: SchedulerLink) -> bool:
    return link.connected.is_set() and link.serving
