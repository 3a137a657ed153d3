"""The front door's one multiplexed stream to the scheduler.

Each submitted request gets a session key (SubmitRequest.key: the scheduler's packed messages
name requests by it) and an asyncio.Queue that receives its `Update`s in order. Every live
request is recorded with its output so far (tokenizer_service.live_requests). If the stream
breaks, the link reconnects with backoff (a fresh session id each time) and resubmits every
unfinished request as a continuation: the client sees a pause, not an error. Meanwhile
readiness is NOT_SERVING and requests are held with a bound: after `hold_s` without a scheduler
every held request fails with UNAVAILABLE and new ones are refused until it is back.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import grpc
import structlog

from radixmesh_server.server import Health, channel
from radixmesh_wire.pb import api_pb2, scheduler_pb2, scheduler_pb2_grpc
from tokenizer_service.deltas import Update, unpack_message
from tokenizer_service.live_requests import LiveRequest, LiveTable

log = structlog.get_logger(__name__)


class SchedulerLost(Exception):
    pass


class DuplicateRequest(Exception):
    """A request id that is still running on this link (the running one stays abortable)."""


_MAX_KEY = (1 << 31) - 1  # keys travel as int32


class SchedulerLink:
    def __init__(self, address: str, hold_s: float = 60.0) -> None:
        self.address = address
        self.hold_s = hold_s
        self.session_id = ""
        self.live = LiveTable()  # by key
        self.keys: dict[str, int] = {}  # rid -> key of its latest submission
        self._last_key = 0
        self.out: asyncio.Queue[scheduler_pb2.FrontendMessage] = asyncio.Queue()
        self.hello: scheduler_pb2.SchedulerHello | None = None
        self.connected = asyncio.Event()
        self.down_since: float | None = time.monotonic()  # None while connected

    @property
    def refusing(self) -> bool:
        """Down for longer than the hold bound: new requests are refused, not held."""
        return self.down_since is not None and time.monotonic() - self.down_since > self.hold_s

    def submit(self, msg: scheduler_pb2.SubmitRequest) -> asyncio.Queue[Update | Exception]:
        """Assigns `msg.key`, sends the request (or holds it until the scheduler is back),
        and returns the queue of its updates."""
        if self.refusing:
            raise SchedulerLost(
                f"the scheduler has been unreachable for more than {self.hold_s:g} s; retry later"
            )
        if msg.rid in self.keys:
            raise DuplicateRequest(f"request {msg.rid!r} is running: use another request_id")
        msg.key = self._next_key()
        q: asyncio.Queue[Update | Exception] = asyncio.Queue()
        self.live.add(LiveRequest(msg, q))
        # Never replaced while it runs: Abort(rid) must keep finding the first request even
        # when another session's duplicate is refused by the scheduler.
        self.keys[msg.rid] = msg.key
        if self.connected.is_set():
            self.out.put_nowait(scheduler_pb2.FrontendMessage(submit=msg))
        return q

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

    async def run(self, health: Health) -> None:
        backoff = 0.1
        while True:
            try:
                await self._session(health)
                backoff = 0.1
            except grpc.aio.AioRpcError as exc:
                log.warning("scheduler_link_down", code=exc.code().name, details=exc.details())
            if self.connected.is_set():
                self.down_since = time.monotonic()
                log.warning("scheduler_lost", held=len(self.live))
            self.connected.clear()
            await health.set_ready(False, "scheduler unreachable")
            if self.refusing and len(self.live):
                self.live.fail_all(
                    SchedulerLost(
                        f"the scheduler has been unreachable for more than {self.hold_s:g} s"
                    )
                )
                self.keys.clear()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _session(self, health: Health) -> None:
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
            resumed = self.live.continuations()
            for msg in resumed:  # before anything new: the queue keeps submission order
                self.out.put_nowait(scheduler_pb2.FrontendMessage(submit=msg))
            if self.down_since is not None:
                log.info(
                    "scheduler_connected",
                    resubmitted=len(resumed),
                    down_s=round(time.monotonic() - self.down_since, 2),
                )
            self.down_since = None
            self.connected.set()
            await health.set_ready(True, "scheduler connected")
            while (msg := await call.read()) is not grpc.aio.EOF:
                for key, update in unpack_message(msg).items():
                    self.live.deliver(key, update)


def _aborted(key: int) -> Update:
    u = Update()
    u.extras = scheduler_pb2.DeltaExtras(key=key, finish_reason=api_pb2.FINISH_REASON_ABORT)
    return u
