"""The front door's one multiplexed stream to the scheduler.

Each submitted request gets a session key (SubmitRequest.key: the scheduler's packed messages
name requests by it) and an `Inbox` (routing/inbox.py) that receives its `Update`s in order.
Every live request is recorded with its output so far (tokenizer_service.routing.live_requests).
If the stream breaks, the link reconnects with backoff (a fresh session id each time) and
resubmits every unfinished request as a continuation: the client sees a pause, not an error.
Meanwhile readiness is NOT_SERVING and requests are held with a bound: after `hold_s` without a
scheduler every held request fails with UNAVAILABLE and new ones are refused until it is back.

One link is one replica of a `ReplicaSet` (tokenizer_service.routing.replica_set), which is told of
every connect and disconnect (`on_state`) and may move the link's live requests to another
replica (`take_unfinished` here, `adopt` there). The link also keeps the replica's
`ReplicaView` (cache blocks and load) from the hello, CacheEvents and LoadReports it reads.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from radixmesh_wire.pb import api_pb2, scheduler_pb2, scheduler_pb2_grpc
from services.reconnect import reconnect_forever
from services.server import READINESS, channel
from tokenizer_service.routing.deltas import Update
from tokenizer_service.routing.inbox import Inbox
from tokenizer_service.routing.live_requests import LiveRequest, LiveTable
from tokenizer_service.routing.replica_view import Load, ReplicaView

PROBE_TIMEOUT_S = 5.0  # a readiness answer this late still counts
RECHECK_S = 0.1  # probe period while the replica is not serving

log = structlog.get_logger(__name__)


class SchedulerLost(Exception):
    pass


class DuplicateRequest(Exception):
    """A request id that is still running on this link (the running one stays abortable)."""


_MAX_KEY = (1 << 31) - 1  # keys travel as int32


class SchedulerLink:
    def __init__(
        self,
        address: str,
        hold_s: float = 60.0,
        block_cap: int = 65536,
        probe_s: float = 1.0,
    ) -> None:
        self.address = address
        self.hold_s = hold_s
        self.probe_s = probe_s
        # The scheduler's own readiness (its model is connected), probed every probe_s while
        # the session is up: a replica whose model is away takes no traffic while another
        # can (it holds what it gets until --model-hold-s).
        self.serving = True
        self.view = ReplicaView(block_cap)
        self.draining = False  # gone from discovery: no new requests, live ones finish
        # Told after every connect and disconnect (the ReplicaSet: readiness, failover).
        self.on_state: Callable[[SchedulerLink], Awaitable[None]] | None = None
        self._unary: grpc.aio.Channel | None = None
        self.session_id = ""
        self.live = LiveTable()  # by key
        self.keys: dict[str, int] = {}  # rid -> key of its latest submission
        self._last_key = 0
        self.out: asyncio.Queue[scheduler_pb2.FrontendMessage] = asyncio.Queue()
        self.hello: scheduler_pb2.SchedulerHello | None = None
        # The model's window as last told: the hello's (0 when the session opened before the
        # model connected), then every load report's, so a model that connects later (or
        # returns with another window) is validated against its own window, not a fallback.
        self.context_length = 0
        self.connected = asyncio.Event()
        self.down_since: float | None = time.monotonic()  # None while connected

    @property
    def refusing(self) -> bool:
        """Down for longer than the hold bound: new requests are refused, not held."""
        return self.down_since is not None and time.monotonic() - self.down_since > self.hold_s

    def submit(self, msg: scheduler_pb2.SubmitRequest) -> Inbox:
        """Assigns `msg.key`, sends the request (or holds it until the scheduler is back),
        and returns the inbox of its updates."""
        if self.refusing:
            raise SchedulerLost(
                f"the scheduler has been unreachable for more than {self.hold_s:g} s; retry later"
            )
        if msg.rid in self.keys:
            raise DuplicateRequest(f"request {msg.rid!r} is running: use another request_id")
        q = Inbox()
        self.adopt(LiveRequest(msg, q))
        return q

    def adopt(self, live: LiveRequest) -> int:
        """Take on a request (new, or moved here from another replica with its output so far):
        give it a key of this session, send it (as a continuation when it has output) or hold
        it until connected; returns the key."""
        live.submit.key = self._next_key()
        self.live.add(live)
        # Never replaced while it runs: Abort(rid) must keep finding the first request even
        # when another session's duplicate is refused by the scheduler.
        self.keys[live.submit.rid] = live.submit.key
        if self.connected.is_set():
            self.out.put_nowait(scheduler_pb2.FrontendMessage(submit=live.continuation()))
        return live.submit.key

    def take_unfinished(self) -> list[LiveRequest]:
        """Remove and return every request still waiting for output (to move it elsewhere),
        aborting it at the scheduler if the session is up; requests whose final update is
        queued stay until their stream takes it."""
        moving = [lv for lv in self.live.by_key.values() if not lv.ended]
        for lv in moving:
            self.abort(lv.submit.rid, lv.submit.key)
        return moving

    @property
    def stub(self) -> scheduler_pb2_grpc.SchedulerStub:
        """For unary calls (GetStats, FlushCache)."""
        return scheduler_pb2_grpc.SchedulerStub(self._unary_channel())

    def _unary_channel(self) -> grpc.aio.Channel:
        """One channel for the link's lifetime (unary calls, readiness probes)."""
        if self._unary is None:
            self._unary = channel(self.address)
        return self._unary

    async def close(self) -> None:
        if self._unary is not None:
            await self._unary.close()
            self._unary = None

    def _next_key(self) -> int:
        # Counting up: a key comes back only after 2**31 submissions on this link, so late
        # output of a request abandoned here (abort) can never reach a newer one.
        key = self._last_key
        while True:
            key = key + 1 if key < _MAX_KEY else 1
            if key not in self.live:
                self._last_key = key
                return key

    def abort(self, rid: str, key: int) -> None:
        """Stop delivering to this request's queue and tell the scheduler to drop it."""
        known = key in self.live
        self.done(rid, key)
        if known and self.connected.is_set():
            self.out.put_nowait(
                scheduler_pb2.FrontendMessage(abort=scheduler_pb2.AbortRequestInternal(rid=rid))
            )

    def request_abort(self, rid: str) -> bool:
        """Client-initiated abort: the request's own stream still receives its final update."""
        key = self.keys.get(rid)
        if key is None:
            return False
        if not self.connected.is_set():  # held: end it here, nothing to tell the scheduler
            live = self.live.get(key)
            if live is not None and not live.ended:
                live.ended = True
                live.queue.put_nowait(_aborted(key))
            return True
        self.out.put_nowait(
            scheduler_pb2.FrontendMessage(abort=scheduler_pb2.AbortRequestInternal(rid=rid))
        )
        return True

    def end_all(self, reason: str) -> None:
        """Shutdown: every live request ends now with UNAVAILABLE and `reason`."""
        self.live.fail_all(SchedulerLost(reason))
        self.keys.clear()

    def done(self, rid: str, key: int) -> None:
        self.live.remove(key)
        if self.keys.get(rid) == key:
            del self.keys[rid]

    async def run(self) -> None:
        await reconnect_forever(self._attempt)

    async def _attempt(self) -> bool:
        """One session to its end, then what its loss means; False when it failed."""
        ok = True
        try:
            await self._session()
        except grpc.aio.AioRpcError as exc:
            ok = False
            log.warning(
                "scheduler_link_down",
                replica=self.address,
                code=exc.code().name,
                details=exc.details(),
            )
        was_connected = self.connected.is_set()
        if was_connected:
            self.down_since = time.monotonic()
            log.warning("scheduler_lost", replica=self.address, live=len(self.live))
        self.connected.clear()
        if was_connected and self.on_state is not None:
            await self.on_state(self)  # may move the live requests to another replica
        if self.refusing and len(self.live):
            self.live.fail_all(
                SchedulerLost(f"the scheduler has been unreachable for more than {self.hold_s:g} s")
            )
            self.keys.clear()
        return ok

    async def _session(self) -> None:
        async with channel(self.address) as chan:
            stub = scheduler_pb2_grpc.SchedulerStub(chan)
            self.out = asyncio.Queue()
            # A fresh session per connection: the scheduler forgets a session when its stream
            # ends, which must never race with this connection's registration.
            session_id = uuid.uuid4().hex[:12]

            async def requests():  # type: ignore[no-untyped-def]
                yield scheduler_pb2.FrontendMessage(
                    hello=scheduler_pb2.FrontendHello(session_id=session_id)
                )
                while True:
                    yield await self.out.get()

            call = stub.Session(requests())
            first = await call.read()
            if first is grpc.aio.EOF:
                return
            self.hello = first.hello
            self.session_id = session_id
            h = first.hello
            self.context_length = h.context_length or self.context_length
            self.view.on_hello(h.instance_id, h.cache_block_tokens, h.kv_capacity)
            self._observe(first)  # the snapshot may ride on the hello
            resumed = self.live.continuations()
            for msg in resumed:  # before anything new: the queue keeps submission order
                self.out.put_nowait(scheduler_pb2.FrontendMessage(submit=msg))
            if self.down_since is not None:
                log.info(
                    "scheduler_connected",
                    replica=self.address,
                    instance=h.instance_id,
                    resubmitted=len(resumed),
                    down_s=round(time.monotonic() - self.down_since, 2),
                )
            self.down_since = None
            self.serving = True  # until the first probe says otherwise
            self.connected.set()
            if self.on_state is not None:
                await self.on_state(self)
            probe = asyncio.create_task(self._probe_readiness())
            try:
                while (msg := await call.read()) is not grpc.aio.EOF:
                    self._observe(msg)
                    self.live.deliver_message(msg)
            finally:
                probe.cancel()

    async def _probe_readiness(self) -> None:
        """Every probe_s; every RECHECK_S while not serving, so a replica whose model just
        connected takes traffic at once (a start-up probe answered NOT_SERVING used to keep
        it out for a whole period, and a burst meanwhile all went to the others). A probe
        that fails or times out changes nothing: a busy scheduler answers late, and the
        session stream itself tells a dead one."""
        stub = health_pb2_grpc.HealthStub(self._unary_channel())
        while True:
            try:
                resp = await stub.Check(
                    health_pb2.HealthCheckRequest(service=READINESS),
                    timeout=max(self.probe_s, PROBE_TIMEOUT_S),
                )
                serving = resp.status == health_pb2.HealthCheckResponse.SERVING
            except grpc.aio.AioRpcError as exc:
                serving = self.serving
                log.debug("replica_probe_failed", replica=self.address, code=exc.code().name)
            if serving != self.serving:
                self.serving = serving
                (log.info if serving else log.warning)(
                    "replica_readiness", replica=self.address, serving=serving
                )
                if self.on_state is not None:
                    await self.on_state(self)
            await asyncio.sleep(self.probe_s if self.serving else min(self.probe_s, RECHECK_S))

    def _observe(self, msg: scheduler_pb2.SchedulerMessage) -> None:
        """The replica's cache events and load report, into its view."""
        if msg.HasField("cache"):
            c = msg.cache
            self.view.on_cache_events(c.reset, c.added, c.removed, c.host)
        if msg.HasField("load"):
            self.view.on_load(_load(msg.load))
            if msg.load.context_length:
                self.context_length = msg.load.context_length


def _load(m: scheduler_pb2.LoadReport) -> Load:
    return Load(
        waiting_requests=m.waiting_requests,
        running_requests=m.running_requests,
        waiting_tokens=m.waiting_tokens,
        running_tokens=m.running_tokens,
        kv_capacity=m.kv_capacity,
        kv_free=m.kv_free,
        cache_hit_rate=m.cache_hit_rate,
    )


def _aborted(key: int) -> Update:
    u = Update()
    u.extras = scheduler_pb2.DeltaExtras(key=key, finish_reason=api_pb2.FINISH_REASON_ABORT)
    return u
