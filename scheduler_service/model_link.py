"""The scheduler's end of the step stream to the model service.

`connect()` opens a session and returns the worker's info; `send(step)` writes a step and
returns a future for its result (results come back in order), so a caller may keep several
steps in flight. When the stream breaks every pending future fails with `ModelUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque

import grpc
import structlog

from radixmesh_server.server import channel
from radixmesh_wire.pb import model_pb2, model_pb2_grpc

log = structlog.get_logger(__name__)


class ModelUnavailable(Exception):
    pass


class ModelLink:
    def __init__(self, address: str) -> None:
        self.address = address
        self.info: model_pb2.WorkerInfo | None = None
        self._chan: grpc.aio.Channel | None = None
        self._out: asyncio.Queue[model_pb2.StepRequest | None] = asyncio.Queue()
        self._pending: deque[tuple[int, asyncio.Future[model_pb2.StepResult]]] = deque()
        self._reader: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()

    @property
    def connected(self) -> bool:
        return self.info is not None and not self.closed.is_set()

    async def connect(self, timeout: float = 5.0) -> model_pb2.WorkerInfo:
        self._chan = channel(self.address)
        stub = model_pb2_grpc.ModelWorkerStub(self._chan)
        sid = uuid.uuid4().hex[:12]
        self._out = asyncio.Queue()
        self.closed = asyncio.Event()

        async def requests():  # type: ignore[no-untyped-def]
            yield model_pb2.StepRequest(open=model_pb2.OpenSession(session_id=sid))
            while (msg := await self._out.get()) is not None:
                yield msg

        call = stub.Steps(requests())
        try:
            first = await asyncio.wait_for(call.read(), timeout)
        except (grpc.aio.AioRpcError, asyncio.TimeoutError) as exc:
            call.cancel()
            await self._chan.close()
            raise ModelUnavailable(f"cannot open a step session at {self.address}: {exc}") from exc
        if first is grpc.aio.EOF or first.WhichOneof("kind") != "opened":
            raise ModelUnavailable("model service closed the session at once")
        self.info = first.opened.info
        self._reader = asyncio.create_task(self._read(call))
        log.info("model_session", capacity=self.info.kv_capacity, model=self.info.model_name)
        return self.info

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        reason = "stream ended"
        try:
            while (reply := await call.read()) is not grpc.aio.EOF:
                if not self._pending:
                    continue
                step_id, fut = self._pending.popleft()
                if not fut.done():
                    fut.set_result(reply.result)
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            reason = "closed"
        finally:
            self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        self.closed.set()
        while self._pending:
            _, fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(ModelUnavailable(f"model service lost: {reason}"))
        log.warning("model_link_closed", reason=reason)

    def send(self, step: model_pb2.Step) -> asyncio.Future[model_pb2.StepResult]:
        fut: asyncio.Future[model_pb2.StepResult] = asyncio.get_running_loop().create_future()
        if self.closed.is_set():
            fut.set_exception(ModelUnavailable("model service is not connected"))
            return fut
        self._pending.append((step.step_id, fut))
        self._out.put_nowait(model_pb2.StepRequest(step=step))
        return fut

    def send_masks(self, masks: model_pb2.StepMasks) -> None:
        """The late masks of a sent `masks_follow` step (no reply of its own)."""
        if not self.closed.is_set():
            self._out.put_nowait(model_pb2.StepRequest(masks=masks))

    async def close(self) -> None:
        self._out.put_nowait(None)
        if self._reader:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._chan:
            await self._chan.close()
