"""The scheduler's gRPC face: front-door sessions (submit/abort in, one packed message of
output per step out) and GetStats. Protobuf stops here: submissions become `Request`
dataclasses, outbox `Batch`es become `SchedulerMessage`s."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from radixmesh_wire.cache_blocks import namespace_offset
from radixmesh_wire.packing import pack_i32
from radixmesh_wire.pb import api_pb2, scheduler_pb2, scheduler_pb2_grpc
from radixmesh_wire.sampling import sampling_from_params
from radixmesh_wire.step_codec import image_from_proto
from scheduler_service.interface import SchedulerInterface, SessionInUse
from scheduler_service.request import Request
from scheduler_service.sessions.outbox import Batch, Extra, error_batch
from scheduler_service.sessions.replica_feed import Feed
from scheduler_service.status import GrammarUnavailable, Status
from scheduler_service.submit_validation import SubmitError
from services.security import require_peer

log = structlog.get_logger(__name__)

_FINISH: dict[str, Any] = {
    "stop": api_pb2.FINISH_REASON_STOP,
    "length": api_pb2.FINISH_REASON_LENGTH,
    "abort": api_pb2.FINISH_REASON_ABORT,
}


def request_from_proto(msg: scheduler_pb2.SubmitRequest, session: str) -> Request:
    s, lp = msg.sampling, msg.logprobs
    spec = sampling_from_params(s, lp)  # unset fields: the defaults table's
    kind = s.WhichOneof("constraint")
    return Request(
        rid=msg.rid,
        session=session,
        prompt=list(msg.input_ids),
        spec=spec,
        eos_ids=frozenset(msg.eos_token_ids),
        output=list(msg.output_ids),
        resumed_output=len(msg.output_ids),
        grammar=(kind, getattr(s, kind)) if kind else None,
        key=msg.key,
        cache_ns=namespace_offset(msg.cache_namespace),
        images=tuple(image_from_proto(im) for im in msg.images),
    )


def batch_to_proto(b: Batch) -> scheduler_pb2.SchedulerMessage:
    # Two bytes fields for the common case; a message object only per request with extras.
    msg = scheduler_pb2.SchedulerMessage(
        keys=pack_i32(b.keys),
        events=pack_i32(b.events),
        extras=[_extra_to_proto(ex) for ex in b.extras],
    )
    if b.feed is not None:
        _add_feed(msg, b.feed)
    return msg


def _add_feed(msg: scheduler_pb2.SchedulerMessage, feed: Feed) -> None:
    if feed.cache is not None:
        c = feed.cache
        msg.cache.reset = c.reset
        msg.cache.added.extend(c.added)
        msg.cache.removed.extend(c.removed)
        msg.cache.host.extend(c.host)
    if feed.load is not None:
        ld = feed.load
        msg.load.waiting_requests = ld.waiting_requests
        msg.load.running_requests = ld.running_requests
        msg.load.waiting_tokens = ld.waiting_tokens
        msg.load.running_tokens = ld.running_tokens
        msg.load.kv_capacity = ld.kv_capacity
        msg.load.kv_free = ld.kv_free
        msg.load.cache_hit_rate = ld.cache_hit_rate
        msg.load.context_length = ld.context_length


def _extra_to_proto(ex: Extra) -> scheduler_pb2.DeltaExtras:
    out = scheduler_pb2.DeltaExtras(key=ex.key)
    if ex.finish:
        out.finish_reason = _FINISH[ex.finish]
    if ex.matched_stop_token >= 0:
        out.matched_stop_token = ex.matched_stop_token
    if ex.error_code:
        out.error_code = ex.error_code
        out.error_message = ex.error_message
    if ex.cached_tokens >= 0:
        out.cached_tokens = ex.cached_tokens
    for tok, lp, top_ids, top_lps in ex.logprobs:
        out.logprobs.append(
            api_pb2.TokenLogprob(
                token_id=tok,
                logprob=lp,
                top=[
                    api_pb2.TopLogprob(token_id=i, logprob=v)
                    for i, v in zip(top_ids, top_lps, strict=False)
                ],
            )
        )
    for tok, lp in ex.prompt_logprobs:
        out.prompt_logprobs.append(api_pb2.TokenLogprob(token_id=tok, logprob=lp))
    return out


def _error(req: Request, code: Status, message: str) -> Batch:
    return error_batch(req.key, req.rid, int(code), message)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    """Speaks to the scheduler only through its interface (scheduler_service.interface)."""

    def __init__(self, scheduler: SchedulerInterface) -> None:
        self.sched = scheduler
        self._tasks: set[asyncio.Task[None]] = set()
        self._sessions_opened = 0

    async def Session(
        self,
        request_iterator: AsyncIterator[scheduler_pb2.FrontendMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[scheduler_pb2.SchedulerMessage]:
        # Read the caller's first message before refusing it: an abort while the client's
        # write is still in flight reaches the client as INTERNAL, not our status
        # (grpc/grpc#36066), and a refused role must see PERMISSION_DENIED and why.
        first = await anext(aiter(request_iterator), None)
        await require_peer(context, "tokenizer")
        if first is None or first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "first message must be hello")
            return
        session = first.hello.session_id or uuid.uuid4().hex
        out: asyncio.Queue[scheduler_pb2.SchedulerMessage | None] = asyncio.Queue()

        def sink(batch: Batch) -> None:
            out.put_nowait(batch_to_proto(batch))

        try:
            opened = self.sched.open_session(session, sink)
        except SessionInUse:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS,
                "that session is open on another stream; a front door opens a session once",
            )
            return
        label = self._label(session)
        opening = scheduler_pb2.SchedulerMessage()
        _add_feed(opening, opened.feed)
        if opening.HasField("cache") or opening.HasField("load"):
            out.put_nowait(opening)
        yield scheduler_pb2.SchedulerMessage(
            hello=scheduler_pb2.SchedulerHello(
                session_id=session,
                kv_capacity=opened.kv_capacity,
                context_length=opened.context_length,
                cache_block_tokens=opened.cache_block_tokens,
                instance_id=opened.instance_id,
            )
        )
        log.info(
            "frontend_session",
            session=label,
            cache_blocks=len(opening.cache.added),
            host_cache_blocks=len(opening.cache.host),
        )

        async def read() -> None:
            try:
                async for msg in request_iterator:
                    kind = msg.WhichOneof("kind")
                    if kind == "submit":
                        self._submit(msg.submit, session, sink)
                    elif kind == "abort":
                        self.sched.abort(msg.abort.rid, session)
            finally:
                out.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (msg := await out.get()) is not None:
                yield msg
        finally:
            reader.cancel()
            self.sched.close_session(session)
            log.info("frontend_session_closed", session=label)

    def _label(self, session: str) -> int:
        """A session's name in logs: a counter, never the id (which names the stream)."""
        self._sessions_opened += 1
        return self._sessions_opened

    def _submit(self, msg: scheduler_pb2.SubmitRequest, session: str, sink) -> None:  # type: ignore[no-untyped-def]
        req = request_from_proto(msg, session)
        if self.sched.is_running(req.rid):  # before compiling: the running one stays abortable
            sink(_error(req, Status.ALREADY_EXISTS, f"request {req.rid!r} is running"))
            return
        if req.grammar is None:
            self._admit(req, sink)
        else:  # compile first (off the read loop): a bad grammar never reaches the queue
            task = asyncio.create_task(self._compile_then_admit(req, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _admit(self, req: Request, sink) -> None:  # type: ignore[no-untyped-def]
        try:
            self.sched.submit(req)
        except SubmitError as exc:
            sink(_error(req, exc.code, str(exc)))

    async def _compile_then_admit(self, req: Request, sink) -> None:  # type: ignore[no-untyped-def]
        assert req.grammar is not None
        try:
            ok, error = await self.sched.compile_grammar(*req.grammar)
        except GrammarUnavailable as exc:
            sink(_error(req, Status.UNAVAILABLE, str(exc)))
            return
        if not ok:
            sink(_error(req, Status.INVALID_ARGUMENT, f"invalid {req.grammar[0]}: {error}"))
            return
        self._admit(req, sink)

    async def FlushCache(
        self, request: scheduler_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.FlushCacheResponse:
        # Only a front door flushes (its admin-scoped /flush_cache): any other certificate of
        # the deployment's CA could otherwise empty every tenant's cache.
        await require_peer(context, "tokenizer")
        done = self.sched.flush_cache()
        return scheduler_pb2.FlushCacheResponse(
            flushed=done.flushed, evicted_tokens=done.evicted_tokens, message=done.message
        )

    async def GetStats(
        self, request: api_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.Stats:
        await require_peer(context, "tokenizer")
        snap = self.sched.snapshot()
        if snap is None:
            return api_pb2.Stats()
        return api_pb2.Stats(
            token_usage=snap.token_usage,
            **{f.name: getattr(snap, f.name) for f in dataclasses.fields(snap)},
        )
