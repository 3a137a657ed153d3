"""The scheduler's end of the step stream to the model service.

`connect()` opens a session and returns the worker's info; `send(ops)` writes a step and
returns a future for its result (results come back in order), so a caller may keep several
steps in flight. When the stream breaks every pending future fails with `ModelUnavailable`.
Steps, late masks and results are typed (`radixmesh_wire.step_ops`): this module encodes and
decodes them (`radixmesh_wire.step_codec`), so the scheduler's core never sees protobuf. A step
that encodes to more than the message bound is never handed to gRPC: the session is lost with
a reason naming the step and its size (gRPC itself would break the stream with "INTERNAL:
Internal error from Core").

HTTP/2 keepalive alone notices a frozen peer (SIGSTOP, a wedged host) only after a minute: while
a session is open a prober asks the model's `liveness` health every `probe_s` and declares the
session lost after `probe_misses` unanswered or NOT_SERVING replies (a stuck step thread turns
the model's liveness NOT_SERVING through its watchdog), so a stuck model is noticed in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from radixmesh_wire.pb import model_pb2, model_pb2_grpc
from radixmesh_wire.step_codec import (
    decode_output,
    decode_worker_info,
    encode_masks,
    encode_step,
)
from radixmesh_wire.step_ops import LateMasks, StepOps, StepOutcome, WorkerInfo
from services.server import LIVENESS, MAX_MESSAGE_BYTES, channel

log = structlog.get_logger(__name__)


class ModelUnavailable(Exception):
    pass


class ModelLink:
    """Invariant: `connected` is true only between a session's `opened` reply and its loss;
    a reconnect in progress is not connected (submissions are then held, not sent)."""

    def __init__(self, address: str, probe_s: float = 1.0, probe_misses: int = 2) -> None:
        self.address = address
        self.probe_s = probe_s
        self.probe_misses = probe_misses
        self.info: WorkerInfo | None = None
        self._chan: grpc.aio.Channel | None = None
        self._out: asyncio.Queue[model_pb2.StepRequest | None] = asyncio.Queue()
        self._pending: deque[tuple[int, asyncio.Future[StepOutcome]]] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._call: grpc.aio.StreamStreamCall | None = None  # the open session's stream
        self._prober: asyncio.Task[None] | None = None
        self._lost_reason = ""
        self.closed = asyncio.Event()
        self.closed.set()  # no session yet

    @property
    def connected(self) -> bool:
        return self.info is not None and not self.closed.is_set()

    async def connect(self, timeout: float = 5.0) -> WorkerInfo:
        self._chan = channel(self.address)
        stub = model_pb2_grpc.ModelWorkerStub(self._chan)
        sid = uuid.uuid4().hex[:12]
        self._out = asyncio.Queue()
        self._lost_reason = ""

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
            call.cancel()
            await self._chan.close()
            raise ModelUnavailable("model service closed the session at once")
        self.info = decode_worker_info(first.opened.info)
        self.closed = asyncio.Event()
        self._call = call
        self._reader = asyncio.create_task(self._read(call))
        self._prober = asyncio.create_task(self._probe(call, self._chan))
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
                    fut.set_result(decode_output(reply.result))
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            reason = "closed"
        finally:
            self._fail_all(self._lost_reason or reason)

    async def _probe(self, call: grpc.aio.StreamStreamCall, chan: grpc.aio.Channel) -> None:
        """Ends the session when the model stops answering its liveness check."""
        stub = health_pb2_grpc.HealthStub(chan)
        misses = 0
        while not self.closed.is_set():
            await asyncio.sleep(self.probe_s)
            try:
                resp = await stub.Check(
                    health_pb2.HealthCheckRequest(service=LIVENESS), timeout=self.probe_s * 2
                )
                ok = resp.status == health_pb2.HealthCheckResponse.SERVING
                why = "its liveness is NOT_SERVING (a stuck step thread)"
            except grpc.aio.AioRpcError as exc:
                # Only silence counts: a draining model refuses new calls (UNAVAILABLE) while
                # its step stream works on, and a dead one breaks the stream itself.
                ok = exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED
                why = "its liveness check went unanswered"
            misses = 0 if ok else misses + 1
            if misses >= self.probe_misses:
                self._lost_reason = f"model service unresponsive: {why}"
                log.warning("model_unresponsive", reason=why, misses=misses)
                call.cancel()  # the reader sees the cancellation and fails pending steps
                return

    def _fail_all(self, reason: str) -> None:
        self.closed.set()
        if self._prober is not None:
            self._prober.cancel()
        while self._pending:
            _, fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(ModelUnavailable(f"model service lost: {reason}"))
        log.warning("model_link_closed", reason=reason)

    def send(self, ops: StepOps) -> asyncio.Future[StepOutcome]:
        fut: asyncio.Future[StepOutcome] = asyncio.get_running_loop().create_future()
        # A loss fails every pending step; the loop awaits only the oldest, the rest are moot.
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        if self.closed.is_set():
            fut.set_exception(ModelUnavailable("model service is not connected"))
            return fut
        self._pending.append((ops.step_id, fut))
        msg = model_pb2.StepRequest(step=encode_step(ops))
        size = msg.ByteSize()  # ~0.3 us for a decode step of 256 rows
        if size > MAX_MESSAGE_BYTES:
            # gRPC would refuse to send it and break the stream saying only "INTERNAL: Internal
            # error from Core". The session is lost either way (the model service never sees
            # this step's releases, so the two sides' state would part): say why.
            reason = (
                f"step {ops.step_id} encodes to {size} bytes, over the {MAX_MESSAGE_BYTES}-byte"
                " message bound (services/server.py MAX_MESSAGE_BYTES)"
            )
            log.error("model_step_too_large", step=ops.step_id, size=size)
            self._lose(reason)
            return fut
        self._out.put_nowait(msg)
        return fut

    def _lose(self, reason: str) -> None:
        """End the session from this side: the reader sees the cancellation and fails every
        pending step with `reason`."""
        self._lost_reason = reason
        if self._call is not None:
            self._call.cancel()

    def send_masks(self, masks: LateMasks) -> None:
        """The late masks of a sent `masks_follow` step (no reply of its own)."""
        if not self.closed.is_set():
            self._out.put_nowait(model_pb2.StepRequest(masks=encode_masks(masks)))

    async def close(self) -> None:
        self._out.put_nowait(None)
        if self._prober:
            self._prober.cancel()
        if self._reader:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._chan:
            await self._chan.close()
