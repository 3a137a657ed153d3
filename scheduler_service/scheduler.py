"""The scheduling loop: connect to the model service, then build a step, send it, apply the
result, hand deltas to the front-door sessions; repeat while there is work.

Losing the model service fails every request promptly with UNAVAILABLE, frees its slots,
flushes the prefix cache (the KV pool is gone) and reconnects with backoff.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

import grpc
import structlog

from radixmesh_server.server import Health
from radixmesh_wire.pb import model_pb2
from scheduler_service.allocator import SlotAllocator
from scheduler_service.batch_builder import BatchBuilder, PlannedStep
from scheduler_service.config import SchedulerConfig
from scheduler_service.grammar_link import GrammarLink
from scheduler_service.metrics import SchedulerMetrics
from scheduler_service.model_link import ModelLink, ModelUnavailable
from scheduler_service.outbox import Batch
from scheduler_service.output_processor import apply_result
from scheduler_service.policy import SchedulePolicy
from scheduler_service.prefix_cache import make_prefix_cache
from scheduler_service.request import Request
from scheduler_service.state import SchedState
from scheduler_service.step_masks import StepMasks

log = structlog.get_logger(__name__)

Sink = Callable[[Batch], None]  # one session's output of one flush


class SubmitError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class Scheduler:
    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.link = ModelLink(cfg.model_address)
        self.grammar = GrammarLink(cfg.grammar_address)
        self.grammar.on_reconnect = self._rebind_grammars
        self.policy = SchedulePolicy(
            cfg.policy,
            lpm_fallback_queue_len=cfg.lpm_fallback_queue_len,
            in_batch_prefix_threshold=cfg.in_batch_prefix_tokens,
        )
        self.st: SchedState | None = None
        self.info: model_pb2.WorkerInfo | None = None
        self.sinks: dict[str, Sink] = {}
        self.by_rid: dict[str, Request] = {}
        self.aborted: set[str] = set()  # rids to reap before the next step
        self.wake = asyncio.Event()
        self.metrics: SchedulerMetrics | None = None  # set by the service when metrics are on

    # -- front door ---------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        st = self.st
        if st is None or not self.link.connected:
            raise SubmitError(grpc.StatusCode.UNAVAILABLE, "the model service is not connected")
        if req.rid in self.by_rid:
            raise SubmitError(grpc.StatusCode.ALREADY_EXISTS, f"request {req.rid!r} is running")
        need = len(req.fill) + req.remaining
        cap = st.cache.allocator.capacity
        if need > cap:
            raise SubmitError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"prompt ({len(req.fill)} tokens) + max_new_tokens ({req.remaining})"
                f" = {need} exceeds the KV capacity of {cap} tokens: shorten the "
                "prompt or lower max_new_tokens",
            )
        if len(st.waiting) >= self.cfg.max_queue:
            raise SubmitError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the waiting queue is full ({self.cfg.max_queue}); retry later",
            )
        self.by_rid[req.rid] = req
        req.outbox = st.outbox(req.session)
        req.outbox.live += 1
        st.waiting.append(req)
        self.wake.set()

    def abort(self, rid: str, session: str | None = None) -> bool:
        """Abort `rid`; with `session`, only if that session submitted it."""
        req = self.by_rid.get(rid)
        if req is None or self.st is None or (session is not None and req.session != session):
            return False
        req.aborted = True
        self.aborted.add(rid)
        self.wake.set()
        return True

    def drop_session(self, session: str) -> None:
        for r in list(self.by_rid.values()):
            if r.session == session:
                r.aborted = True
                self.aborted.add(r.rid)
        self.sinks.pop(session, None)
        self.wake.set()

    # -- loop ---------------------------------------------------------------------------------
    async def run(self, health: Health) -> None:
        grammar = asyncio.create_task(self.grammar.run())
        try:
            await self._run_model(health)
        finally:
            grammar.cancel()

    def _rebind_grammars(self) -> None:
        """A (re)opened grammar session knows no matchers: bind every constrained running
        request again, replaying its output so far, before any other grammar operation."""
        st = self.st
        if st is None:
            return
        st.grammar_ops.clear()
        for r in st.running.values():
            if r.grammar is not None:
                st.grammar_ops.bind(r.handle, r.grammar[0], r.grammar[1], r.output)
        self.wake.set()

    async def _run_model(self, health: Health) -> None:
        backoff = 0.1
        while True:
            try:
                info = await self.link.connect()
            except ModelUnavailable as exc:
                await health.set_ready(False, str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            self._on_connected(info)
            await health.set_ready(True, "model connected")
            try:
                await self._loop()
            except ModelUnavailable as exc:
                await health.set_ready(False, str(exc))
                self._fail_all(grpc.StatusCode.UNAVAILABLE, str(exc))
                await self.link.close()

    def _on_connected(self, info: model_pb2.WorkerInfo) -> None:
        self.info = info
        cap = int(info.kv_capacity)
        if self.st is None or self.st.cache.allocator.capacity != cap:
            alloc = SlotAllocator(cap, track_freed=info.nan_fill)
            self.st = SchedState(
                cache=make_prefix_cache(
                    self.cfg.radix,
                    alloc,
                    eviction=self.cfg.eviction,
                    protect_s=self.cfg.protect_ms / 1e3,
                ),
                context_length=int(info.context_length),
            )
            if self.metrics is not None:
                self.st.on_admit = self.metrics.queue_time.observe
        else:
            self.st.cache.reset()  # new session: the worker's KV pool content is gone
            self.st.handles.reset()
            self.st.pending_release.clear()
        self.builder = BatchBuilder(self.cfg, self.st, self.policy)
        self.masks = StepMasks(self.cfg, self.st, self.grammar, self._fail)

    async def _idle(self) -> None:
        self.wake.clear()
        closed = asyncio.create_task(self.link.closed.wait())
        woken = asyncio.create_task(self.wake.wait())
        await asyncio.wait({closed, woken}, return_when=asyncio.FIRST_COMPLETED)
        closed.cancel()
        woken.cancel()
        if self.link.closed.is_set():
            raise ModelUnavailable("model service lost")

    async def _loop(self) -> None:
        """Build, send, apply. With overlap, step N+1 is built and sent before N's result
        comes back (at most two steps in flight): the worker queues N+1 behind N, so the GPU
        does not wait for this loop or the gRPC hop. Late masks of a step go out as soon as
        every earlier result is applied."""
        st = self.st
        assert st is not None
        depth = 2 if self.cfg.overlap == "on" else 1
        inflight: deque[tuple[PlannedStep, asyncio.Future[model_pb2.StepResult]]] = deque()
        while True:
            self._reap_aborted()
            sent = False
            if len(inflight) < depth and (st.waiting or st.running):
                t0 = time.perf_counter()
                st.grammar_up = self.grammar.up.is_set()
                plan = self.builder.build()
                st.stats.step_seconds += time.perf_counter() - t0
                await self.masks.before_send(plan)
                if not plan.empty or plan.msg.release_handles:
                    plan.sent_at = time.perf_counter()
                    inflight.append((plan, self.link.send(plan.msg)))
                    sent = True
                    if plan.msg.masks_follow and len(inflight) == 1:
                        self.link.send_masks(await self.masks.after_send(plan))
            if not inflight:
                self._flush()
                await self._idle()
                continue
            if sent and len(inflight) < depth:
                continue  # room for one more step before waiting on the oldest
            plan, fut = inflight.popleft()
            res = await fut
            t1 = time.perf_counter()
            if res.error:
                log.error("step_failed", step=res.step_id, error=res.error)
                for r in [*st.running.values()]:
                    self._fail(r, grpc.StatusCode.INTERNAL, f"model step failed: {res.error}")
            else:
                apply_result(st, plan, res)
            st.stats.steps += 1
            t2 = time.perf_counter()
            st.stats.step_seconds += t2 - t1
            if self.metrics is not None:
                self.metrics.observe_step(t2 - plan.sent_at, len(plan.owners))
            if inflight and inflight[0][0].msg.masks_follow:
                self.link.send_masks(await self.masks.after_send(inflight[0][0]))
            if self.cfg.debug_invariants:
                st.check_integrity()
            self._flush()

    def _reap_aborted(self) -> None:
        st = self.st
        assert st is not None
        if not self.aborted:
            return
        rids, self.aborted = self.aborted, set()
        for rid in rids:
            r = self.by_rid.get(rid)
            if r is None:
                continue
            if r in st.waiting:
                st.waiting.remove(r)
            # Its computed KV is valid (aborts land between steps): keep it as cache. A stop
            # string ends a request through this path, and the DSL continues right after it.
            st.release(r, insert=True)
            st.extra(r).finish = "abort"

    def _fail(self, r: Request, code: grpc.StatusCode, message: str) -> None:
        st = self.st
        assert st is not None
        st.release(r, insert=False)
        ex = st.extra(r)
        ex.error_code = code.value[0]
        ex.error_message = message

    def _fail_all(self, code: grpc.StatusCode, message: str) -> None:
        st = self.st
        if st is None:
            return
        for r in list(self.by_rid.values()):
            if r in st.waiting:
                st.waiting.remove(r)
            self._fail(r, code, message)
        st.cache.reset()
        st.handles.reset()
        st.pending_release.clear()
        self._flush()

    def _flush(self) -> None:
        """Send every session its output since the last flush; forget ended requests."""
        st = self.st
        if st is None:
            return
        for session, box in list(st.outboxes.items()):
            if not box:
                continue
            batch = box.drain()
            for ex in batch.extras:
                if ex.ended and self.by_rid.pop(ex.rid, None) is not None:
                    box.live -= 1
            if box.live <= 0:  # a later submit of this session opens a fresh outbox
                del st.outboxes[session]
            sink = self.sinks.get(session)
            if sink is not None:
                sink(batch)
