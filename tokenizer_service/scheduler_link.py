"""The front door's one multiplexed stream to the scheduler.

Each submitted request gets an asyncio.Queue that receives its RequestDeltas in order. If the
stream breaks, every open queue receives `SchedulerLost` at once (the requests fail with
UNAVAILABLE) and the link reconnects with backoff; readiness follows the link.
"""

from __future__ import annotations

import asyncio
import uuid

import grpc
import structlog

from client.pb import scheduler_pb2, scheduler_pb2_grpc
from services.server import Health, channel

log = structlog.get_logger(__name__)


class SchedulerLost(Exception):
    pass


class SchedulerLink:
    def __init__(self, address: str) -> None:
        self.address = address
        self.session_id = uuid.uuid4().hex[:12]
        self.queues: dict[str, asyncio.Queue[scheduler_pb2.RequestDelta | Exception]] = {}
        self.out: asyncio.Queue[scheduler_pb2.FrontendMessage] = asyncio.Queue()
        self.hello: scheduler_pb2.SchedulerHello | None = None
        self.connected = asyncio.Event()

    def submit(
        self, msg: scheduler_pb2.SubmitRequest
    ) -> asyncio.Queue[scheduler_pb2.RequestDelta | Exception]:
        if not self.connected.is_set():
            raise SchedulerLost("the scheduler is not connected")
        q: asyncio.Queue[scheduler_pb2.RequestDelta | Exception] = asyncio.Queue()
        self.queues[msg.rid] = q
        self.out.put_nowait(scheduler_pb2.FrontendMessage(submit=msg))
        return q

    def abort(self, rid: str) -> None:
        if self.queues.pop(rid, None) is not None and self.connected.is_set():
            self.out.put_nowait(
                scheduler_pb2.FrontendMessage(abort=scheduler_pb2.AbortRequestInternal(rid=rid))
            )

    def request_abort(self, rid: str) -> bool:
        """Client-initiated abort: the request's own stream still receives its final delta."""
        if rid not in self.queues or not self.connected.is_set():
            return False
        self.out.put_nowait(
            scheduler_pb2.FrontendMessage(abort=scheduler_pb2.AbortRequestInternal(rid=rid))
        )
        return True

    def done(self, rid: str) -> None:
        self.queues.pop(rid, None)

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
                for d in msg.deltas:
                    q = self.queues.get(d.rid)
                    if q is not None:
                        q.put_nowait(d)

    def _fail_all(self, reason: str) -> None:
        for q in self.queues.values():
            q.put_nowait(SchedulerLost(reason))
        self.queues.clear()
