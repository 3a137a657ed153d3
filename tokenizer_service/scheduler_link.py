"""The front door's one multiplexed stream to the scheduler.

Each submitted request gets a session key (SubmitRequest.key: the scheduler's packed messages
name requests by it) and an asyncio.Queue that receives its `Update`s in order. If the stream
breaks, every open queue receives `SchedulerLost` at once (the requests fail with UNAVAILABLE)
and the link reconnects with backoff; readiness follows the link.
"""

from __future__ import annotations

import asyncio
import uuid

import grpc
import structlog

from radixmesh_server.server import Health, channel
from radixmesh_wire.pb import scheduler_pb2, scheduler_pb2_grpc
from tokenizer_service.deltas import Update, unpack_message

log = structlog.get_logger(__name__)


class SchedulerLost(Exception):
    pass


class DuplicateRequest(Exception):
    """A request id that is still running on this link (the running one stays abortable)."""


_MAX_KEY = (1 << 31) - 1  # keys travel as int32


class SchedulerLink:
    def __init__(self, address: str) -> None:
        self.address = address
        self.session_id = uuid.uuid4().hex[:12]
        self.queues: dict[int, asyncio.Queue[Update | Exception]] = {}  # by key
        self.keys: dict[str, int] = {}  # rid -> key of its latest submission
        self._last_key = 0
        self.out: asyncio.Queue[scheduler_pb2.FrontendMessage] = asyncio.Queue()
        self.hello: scheduler_pb2.SchedulerHello | None = None
        self.connected = asyncio.Event()

    def submit(self, msg: scheduler_pb2.SubmitRequest) -> asyncio.Queue[Update | Exception]:
        """Assigns `msg.key`, sends the request, and returns the queue of its updates."""
        if not self.connected.is_set():
            raise SchedulerLost("the scheduler is not connected")
        if msg.rid in self.keys:
            raise DuplicateRequest(f"request {msg.rid!r} is running: use another request_id")
        msg.key = self._next_key()
        q: asyncio.Queue[Update | Exception] = asyncio.Queue()
        self.queues[msg.key] = q
        # Never replaced while it runs: Abort(rid) must keep finding the first request even
        # when another session's duplicate is refused by the scheduler.
        self.keys[msg.rid] = msg.key
        self.out.put_nowait(scheduler_pb2.FrontendMessage(submit=msg))
        return q

    def _next_key(self) -> int:
        # Counting up: a key comes back only after 2**31 submissions on this link, so late
        # output of a request abandoned here (abort) can never reach a newer one.
        key = self._last_key
        while True:
            key = key + 1 if key < _MAX_KEY else 1
            if key not in self.queues:
                self._last_key = key
                return key

    def abort(self, rid: str, key: int) -> None:
        """Stop delivering to this request's queue and tell the scheduler to drop it."""
        known = key in self.queues
        self.done(rid, key)
        if known and self.connected.is_set():
            self.out.put_nowait(
                scheduler_pb2.FrontendMessage(abort=scheduler_pb2.AbortRequestInternal(rid=rid))
            )

    def request_abort(self, rid: str) -> bool:
        """Client-initiated abort: the request's own stream still receives its final update."""
        if rid not in self.keys or not self.connected.is_set():
            return False
        self.out.put_nowait(
            scheduler_pb2.FrontendMessage(abort=scheduler_pb2.AbortRequestInternal(rid=rid))
        )
        return True

    def done(self, rid: str, key: int) -> None:
        self.queues.pop(key, None)
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
            self.connected.clear()
            await health.set_ready(False, "scheduler unreachable")
            self._fail_all("scheduler connection lost")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _session(self, health: Health) -> None:
        async with channel(self.address) as chan:
            stub = scheduler_pb2_grpc.SchedulerStub(chan)
            self.out = asyncio.Queue()

            async def requests():  # type: ignore[no-untyped-def]
                yield scheduler_pb2.FrontendMessage(
                    hello=scheduler_pb2.FrontendHello(session_id=self.session_id)
                )
                while True:
                    yield await self.out.get()

            call = stub.Session(requests())
            first = await call.read()
            if first is grpc.aio.EOF:
                return
            self.hello = first.hello
            self.connected.set()
            await health.set_ready(True, "scheduler connected")
            while (msg := await call.read()) is not grpc.aio.EOF:
                for key, update in unpack_message(msg).items():
                    q = self.queues.get(key)
                    if q is not None:
                        q.put_nowait(update)

    def _fail_all(self, reason: str) -> None:
        for q in self.queues.values():
            q.put_nowait(SchedulerLost(reason))
        self.queues.clear()
        self.keys.clear()
