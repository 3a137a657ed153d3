"""gRPC face of the model service: worker info and the step stream (DESIGN.md section 3).

One session at a time owns the KV pool: a new session (a restarted or reconnected scheduler)
ends the previous one and clears all per-request state. Steps are read ahead into a queue and
executed in order on one worker thread, so a scheduler may send step N+1 while step N runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import structlog

from client.pb import model_pb2, model_pb2_grpc
from model_service.engine import Engine
from model_service.runner import StepError
from model_service.step_codec import decode_step, encode_output

log = structlog.get_logger(__name__)


class ModelWorkerServicer(model_pb2_grpc.ModelWorkerServicer):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-step")
        self.session_id: str | None = None
        self.session_gen = 0

    def info(self) -> model_pb2.WorkerInfo:
        e = self.engine
        return model_pb2.WorkerInfo(
            model_name=e.model_name,
            kv_capacity=e.runner.pool.capacity,
            vocab_size=e.vocab_size,
            context_length=e.context_length,
            eos_token_ids=e.eos_token_ids,
            device=str(e.device),
            dtype=str(e.dtype).removeprefix("torch."),
            attention_backend=e.attention_backend,
            nan_fill=e.nan_fill,
        )

    async def GetWorkerInfo(
        self, request: model_pb2.WorkerInfoRequest, context: grpc.aio.ServicerContext
    ) -> model_pb2.WorkerInfo:
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
        sid = first.open.session_id
        self.session_gen += 1
        gen = self.session_gen
        if self.session_id is not None:
            log.warning("session_replaced", old=self.session_id, new=sid)
        self.session_id = sid
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.executor, self.engine.runner.reset)
        log.info("session_opened", session=sid)
        yield model_pb2.StepReply(opened=model_pb2.SessionOpened(session_id=sid, info=self.info()))

        queue: asyncio.Queue[model_pb2.Step | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for msg in request_iterator:
                    if msg.WhichOneof("kind") == "step":
                        await queue.put(msg.step)
            finally:
                await queue.put(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                step = await queue.get()
                if step is None or gen != self.session_gen:
                    break
                ops = decode_step(step)
                try:
                    out = await loop.run_in_executor(self.executor, self.engine.runner.step, ops)
                except Exception as exc:  # noqa: BLE001 - one bad step must not end the session
                    kind = "step_rejected" if isinstance(exc, StepError) else "step_crashed"
                    log.error(
                        kind,
                        session=sid,
                        step=step.step_id,
                        error=repr(exc),
                        exc_info=not isinstance(exc, StepError),
                    )
                    yield model_pb2.StepReply(
                        result=model_pb2.StepResult(
                            step_id=step.step_id, error=f"{type(exc).__name__}: {exc}"
                        )
                    )
                    continue
                yield model_pb2.StepReply(result=encode_output(out))
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            if gen == self.session_gen:
                self.session_id = None
                await loop.run_in_executor(self.executor, self.engine.runner.reset)
            log.info("session_closed", session=sid)
