"""gRPC face of the model service: worker info and the step stream (docs/architecture.md).

One session at a time owns the KV pool: a second session is refused while one is open (with
mutual TLS only the scheduler role may open one), and a new session (a restarted or
reconnected scheduler, once the old stream ended) starts from cleared per-request state. A
newcomer that comes while an ended session still closes (waiting for the steps it launched)
waits for that close instead of being refused (docs/restart.md, "Hand-over").
Steps are read ahead into a queue and run as two halves on two threads: `launch` (queue the
GPU work) in order on the step thread, `finish` (wait, read tokens back) in order on the wait
thread. So when the scheduler sends step N+1 before N's result, N+1 is launched while N still
runs and the GPU never waits for the host. Late grammar masks (`StepMasks`) go through a
mailbox (`mask_mailbox.py`) to the launch that waits for them; a session's host time per part
of a step is counted in `host_costs.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import structlog
import torch

from model_service.engine import Engine
from model_service.host_costs import HostCosts, log_copies
from model_service.mask_mailbox import MaskMailbox
from model_service.mask_mailbox import Masks as Masks  # re-exported
from model_service.mask_mailbox import MaskTimeout as MaskTimeout  # re-exported
from model_service.metrics import ModelMetrics
from model_service.runner import InFlight, StepError
from model_service.step_validation import StepLimits, validate_step
from model_service.tp.group import fatal
from model_service.tp.steps import Leader
from radixmesh_wire.pb import model_pb2, model_pb2_grpc
from radixmesh_wire.step_codec import decode_step, encode_output, encode_step, layout_to_proto
from radixmesh_wire.step_ops import StepOps
from services.security import require_peer
from services.watchdog import Progress

log = structlog.get_logger(__name__)

COSTS_EVERY = 2000  # steps between two `step_host_costs` lines


class ModelWorkerServicer(model_pb2_grpc.ModelWorkerServicer):
    def __init__(
        self,
        engine: Engine,
        mask_wait_s: float = 5.0,
        max_handles: int = 8192,
        progress: Progress | None = None,
    ) -> None:
        self.engine = engine
        self.mask_wait_s = mask_wait_s
        self.limits = StepLimits(
            vocab_size=engine.vocab_size,
            kv_capacity=engine.runner.pool.capacity,
            context_length=engine.context_length,
            max_handles=max_handles,
            host_kv_capacity=engine.runner.pool.host_capacity,
            image_tokens=int(getattr(engine.runner.model, "tokens_per_image", 0)),
            image_geometry=getattr(engine.runner.model, "geometry", None),
        )
        # Step heartbeat for the liveness watchdog: a step that never ends (a stuck step
        # thread) turns liveness NOT_SERVING; the scheduler's prober and the launcher see it.
        self.progress = progress or Progress("model step", 120.0)
        # The current CUDA device is per thread: the step and wait threads use the engine's
        # (a rank on --gpus 2,3 runs on GPU 2, not on the default GPU 0).
        on_device = _device_setter(engine.device)
        self.executor = ThreadPoolExecutor(1, "model-step", initializer=on_device)
        self.waiter = ThreadPoolExecutor(1, "model-wait", initializer=on_device)
        self.session_id: str | None = None
        self._session: StepSession | None = None  # the latest session (open or closing)
        self.session_gen = 0
        self.metrics: ModelMetrics | None = None  # set by the service when metrics are on
        self.tp: Leader | None = None  # tensor parallel: forwards every step to the other ranks
        self.costs = HostCosts()  # the open session's (StepSession starts a fresh one)

    def info(self) -> model_pb2.WorkerInfo:
        e = self.engine
        return model_pb2.WorkerInfo(
            model_name=e.model_name,
            kv_capacity=e.runner.pool.capacity,
            host_kv_capacity=e.runner.pool.host_capacity,
            image_tokens=self.limits.image_tokens,
            image_layout=layout_to_proto(self.limits.image_geometry),
            vocab_size=e.vocab_size,
            context_length=e.context_length,
            eos_token_ids=e.eos_token_ids,
            device=str(e.device),
            dtype=str(e.dtype).removeprefix("torch."),
            attention_backend=e.attention_backend,
            nan_fill=e.nan_fill,
        )

    def launch(self, ops: StepOps, step: model_pb2.Step | None = None) -> InFlight:
        """On the step thread, so the check sees the state the launch will change. With
        tensor parallelism a valid step goes to the other ranks first (`step`: its message);
        a crash that is not a StepError would leave the ranks out of step, so it ends the
        group (the scheduler sees one model-service loss)."""
        costs = self.costs
        t0 = time.perf_counter()
        validate_step(ops, self.engine.runner.requests, self.limits)
        t1 = time.perf_counter()
        costs.check_s += t1 - t0
        try:
            if self.tp is None:
                return self.engine.runner.launch(ops)
            self.tp.step(step if step is not None else encode_step(ops))
            try:
                return self.engine.runner.launch(ops)
            except StepError:
                raise
            except Exception as exc:  # noqa: BLE001
                fatal(f"rank 0 running step {ops.step_id}", exc)
                raise
        finally:
            costs.launch_s += time.perf_counter() - t1

    def reset(self) -> None:
        """Per-request state cleared (on the step thread): on every rank."""
        if self.tp is not None:
            self.tp.reset()
        self.engine.runner.reset()

    async def GetWorkerInfo(
        self, request: model_pb2.WorkerInfoRequest, context: grpc.aio.ServicerContext
    ) -> model_pb2.WorkerInfo:
        await require_peer(context, "scheduler")
        return self.info()

    async def Steps(
        self,
        request_iterator: AsyncIterator[model_pb2.StepRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[model_pb2.StepReply]:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("kind") != "open":
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "the first message of a step stream must be `open`",
            )
            return
        await require_peer(context, "scheduler")
        old = self._session
        if self.session_id is not None and old is not None and old.over:
            # The open session's stream is over (its scheduler died, or the stream broke, e.g.
            # on an over-size message) but its handler is still closing: it waits for the
            # steps it launched. gRPC does not mark a call cancelled by its peer as done, so
            # without this the new scheduler was refused until those steps ended, backing off
            # and retrying. Wait for that close here instead (it is bounded by the steps'
            # own bounds; this caller's deadline or cancellation bounds the wait too), then
            # take the pool: the step thread then never runs an old step beside a reset.
            log.warning("stale_session_waiting", generation=old.gen)
            await asyncio.shield(old.closed)
        if self.session_id is not None:
            # The KV pool belongs to the open session: a second one never disturbs it. A
            # restarted scheduler gets in once the old stream is gone (its socket closes on
            # exit; a frozen one is cut by keepalive within seconds).
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "a scheduler session is already open on this model service; retry once it ends",
            )
            return
        sid = first.open.session_id
        self.session_gen += 1
        self.session_id = sid
        session = self._session = StepSession(self, self.session_gen, request_iterator, context)
        replies = session.serve(sid)
        try:
            async for reply in replies:
                yield reply
        finally:  # gRPC closing this handler at a yield must run the session's close now
            await replies.aclose()

    async def close_session(self, gen: int) -> None:
        """A session's end: free the pool for the next one, unless a newer session took it."""
        if gen == self.session_gen:
            self.session_id = None
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self.executor, self.reset)
        log.info("session_closed", generation=gen)


class StepSession:
    """One open step stream: reads steps ahead into a queue, launches them in order on the
    servicer's step thread, finishes them in order on its wait thread, and replies in step
    order. Late masks go through this session's mailbox. Owns nothing beyond the stream: the
    servicer keeps which session holds the pool (`session_id`, `session_gen`)."""

    def __init__(
        self,
        servicer: ModelWorkerServicer,
        gen: int,
        requests: AsyncIterator[model_pb2.StepRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        self.sv = servicer
        self.gen = gen
        self.requests = requests
        self.runner = servicer.engine.runner
        self.mailbox = MaskMailbox(servicer.mask_wait_s)
        self.queue: asyncio.Queue[model_pb2.Step | None] = asyncio.Queue()
        self.costs = servicer.costs = HostCosts()
        self.ended = asyncio.Event()  # the call is over, whatever the reader saw
        # Invariant: `over` is set once this session serves no more steps (its stream ended,
        # broke or was cancelled); `closed` is done once its launched steps ended and the pool
        # was handed back. A newcomer waits for `closed` only while `over` is set.
        self.over = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        context.add_done_callback(lambda _ctx: self._call_done())

    def _call_done(self) -> None:
        self.over = True
        self.ended.set()

    async def serve(self, sid: str) -> AsyncGenerator[model_pb2.StepReply, None]:
        sv = self.sv
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(sv.executor, sv.reset)
            log.info("session_opened", generation=self.gen)
            yield model_pb2.StepReply(
                opened=model_pb2.SessionOpened(session_id=sid, info=sv.info())
            )
        except BaseException:  # its caller left before the session served a step
            self.over = True
            await asyncio.shield(asyncio.ensure_future(self._close(None, [])))
            raise
        box = self.mailbox
        self.runner.mask_source = sv.tp.masks_source(box.wait_raw) if sv.tp else box.wait
        reader = asyncio.create_task(self._read())
        ended_wait = asyncio.ensure_future(self.ended.wait())
        running: deque[asyncio.Task[model_pb2.StepReply]] = deque()  # in step order
        next_step: asyncio.Task[model_pb2.Step | None] | None = None
        try:
            while True:
                if next_step is None:
                    next_step = asyncio.ensure_future(self.queue.get())
                wanted: set[asyncio.Future] = {next_step, ended_wait}
                if running:
                    wanted.add(running[0])
                await asyncio.wait(wanted, return_when=asyncio.FIRST_COMPLETED)
                if self.ended.is_set():
                    break
                if running and running[0].done():
                    yield running.popleft().result()
                    continue
                step = next_step.result()
                next_step = None
                if step is None or self.gen != sv.session_gen:
                    break
                running.append(asyncio.create_task(self._run(step)))
        finally:
            self.over = True
            if next_step is not None:
                next_step.cancel()
            ended_wait.cancel()
            reader.cancel()
            self.mailbox.close()
            self.costs.log("session closed")
            # The close runs in its own task, shielded: gRPC cancels this handler when the
            # scheduler vanishes (kill -9), and a second cancellation landing inside the close
            # once left `session_id` set for good, so every later scheduler was refused.
            closing = asyncio.ensure_future(self._close(reader, list(running)))
            await asyncio.shield(closing)
            log_copies(self.runner.pool.copy_stats, "session closed")  # after: never in its way

    async def _read(self) -> None:
        try:
            async for msg in self.requests:
                kind = msg.WhichOneof("kind")
                if kind == "step":
                    if msg.step.masks_follow:
                        self.mailbox.expect(msg.step.step_id)
                    await self.queue.put(msg.step)
                elif kind == "masks":
                    self.mailbox.deliver(msg.masks)
        finally:
            self.mailbox.close()
            await self.queue.put(None)

    async def _run(self, step: model_pb2.Step) -> model_pb2.StepReply:
        sv = self.sv
        loop = asyncio.get_running_loop()
        sv.progress.begin()
        costs = self.costs
        try:
            t_dec = time.perf_counter()
            ops = decode_step(step)
            costs.decode_s += time.perf_counter() - t_dec
            for a in ops.admits:  # one line per request admission, naming it
                log.debug("admit", rid=a.rid, handle=a.handle, input_tokens=len(a.input_ids))
            t0 = time.perf_counter()
            fl = await loop.run_in_executor(sv.executor, sv.launch, ops, step)
            sv.progress.beat()
            out = await loop.run_in_executor(sv.waiter, self.runner.finish, fl)
            if sv.metrics is not None:
                sv.metrics.observe(time.perf_counter() - t0, _rows(ops))
        except Exception as exc:  # noqa: BLE001 - one bad step must not end the session
            self.mailbox.discard(step.step_id)
            if sv.metrics is not None:
                sv.metrics.failed()
            kind = "step_rejected" if isinstance(exc, StepError) else "step_crashed"
            log.error(
                kind,
                step=step.step_id,
                error=repr(exc),
                exc_info=not isinstance(exc, StepError),
            )
            return model_pb2.StepReply(
                result=model_pb2.StepResult(
                    step_id=step.step_id, error=f"{type(exc).__name__}: {exc}"
                )
            )
        finally:
            sv.progress.end()
        t_enc = time.perf_counter()
        reply = model_pb2.StepReply(result=encode_output(out))
        costs.encode_s += time.perf_counter() - t_enc
        costs.steps += 1
        if costs.steps % COSTS_EVERY == 0:
            costs.log("periodic")
            log_copies(self.runner.pool.copy_stats, "periodic")
        return reply

    async def _close(
        self,
        reader: asyncio.Task[None] | None,
        running: list[asyncio.Task[model_pb2.StepReply]],
    ) -> None:
        try:
            if reader is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
            for task in running:  # let launched work end before the state is reset
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await task
            await self.sv.close_session(self.gen)
        finally:
            if not self.closed.done():
                self.closed.set_result(None)


def _device_setter(device: torch.device) -> Callable[[], None] | None:
    """The step threads' initializer: pin them to the engine's GPU when it names one. A bare
    "cuda" (one GPU, TP1) needs none, and `set_device` refuses a device without an index: that
    failed the initializer, broke both thread pools, and every session with them (H100)."""
    if device.type != "cuda" or device.index is None:
        return None
    return lambda: torch.cuda.set_device(device)


def _rows(ops: StepOps) -> int:
    """Rows of a step: prefill chunks (admits and extends) plus decodes."""
    return len(ops.admits) + len(ops.extends) + len(ops.decode_handles)
