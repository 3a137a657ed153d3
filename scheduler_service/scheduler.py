"""The scheduling loop: connect to the model service, then build a step, send it, apply the
result, hand deltas to the front-door sessions; repeat while there is work.

Connecting to the model service and losing it are the business of the ModelSession the
Scheduler holds (scheduler_service.model_session); the Scheduler keeps the state and the step
loop, which the session runs on its link and hands each session's state to. Losing the model
(stream broken, or its liveness probe unanswered: see ModelLink) returns every running request
to the queue as a continuation (scheduler_service.continuations), flushes the prefix cache
(the KV pool is gone) and reconnects with backoff. Meanwhile readiness is NOT_SERVING and
requests are held, visibly and with bounds: the queue's --max-queue, and --model-hold-s after
which the held requests fail with UNAVAILABLE and new ones are refused until the model is
back.

Every flush also carries this replica's cache changes and load to every front-door session
(replica_feed, `--cache-events`); the cache is reset on model loss, which publishes a reset.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque

import structlog

from radixmesh_wire.step_ops import StepOutcome, WorkerInfo
from scheduler_service.cache.publisher import CachePublisher
from scheduler_service.config import SchedulerConfig
from scheduler_service.grammar.pool import GrammarPool
from scheduler_service.grammar.step_masks import StepMasks
from scheduler_service.interface import (
    FlushOutcome,
    SchedulerSnapshot,
    SessionInUse,
    SessionOpening,
    Sink,
)
from scheduler_service.links.grammar import GrammarLink
from scheduler_service.links.model import ModelLink, ModelUnavailable
from scheduler_service.metrics import SchedulerMetrics
from scheduler_service.model_session import ModelSession, SessionHooks
from scheduler_service.planner.batch_builder import BatchBuilder, PlannedStep
from scheduler_service.planner.chunk_budget import ChunkBudget
from scheduler_service.planner.output_processor import apply_result
from scheduler_service.planner.policy import SchedulePolicy
from scheduler_service.planner.step_failure import fail_step
from scheduler_service.request import Request
from scheduler_service.sessions.outbox import error_batch
from scheduler_service.sessions.output import SessionOutput
from scheduler_service.sessions.replica_feed import ReplicaFeed
from scheduler_service.startup_hold import StartupHold
from scheduler_service.state import SchedState
from scheduler_service.status import Status
from scheduler_service.submit_validation import (
    SubmitError,
    SubmitLimits,
    check_unique,
    validate_form,
    validate_submit,
)
from services.server import Health
from services.watchdog import Progress

log = structlog.get_logger(__name__)

__all__ = ["Scheduler", "SubmitError"]  # a SchedulerInterface (scheduler_service.interface)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, progress: Progress | None = None) -> None:
        self.cfg = cfg
        # The loop's heartbeat for the liveness watchdog: busy from a wake-up to the next idle.
        self.progress = progress or Progress("scheduler loop", cfg.watchdog_s)
        self.grammar = GrammarPool(
            cfg.grammar_address, GrammarLink, interval_s=cfg.grammar_discovery_s
        )
        self.grammar.on_lost = self._rebind_grammars
        self.grammar.on_change = lambda: self.wake.set()
        self.policy = SchedulePolicy(
            cfg.policy,
            lpm_fallback_queue_len=cfg.lpm_fallback_queue_len,
            in_batch_prefix_threshold=cfg.in_batch_prefix_tokens,
        )
        self.st: SchedState | None = None  # set by each model session (_install)
        self.builder: BatchBuilder  # and these two with it
        self.masks: StepMasks
        self.by_rid: dict[str, Request] = {}
        self.aborted: set[str] = set()  # rids to reap before the next step
        self.wake = asyncio.Event()
        self.metrics: SchedulerMetrics | None = None  # set by the service when metrics are on
        self.early = StartupHold(cfg.max_queue, cfg.model_hold_s)  # before the first session
        # Names this process to front doors: a restarted scheduler's cache starts empty.
        self.instance_id = uuid.uuid4().hex
        publish = cfg.cache_events == "on" and cfg.radix == "tree"
        self.feed = ReplicaFeed(CachePublisher() if publish else None)
        self.out = SessionOutput(self.feed)
        self.sinks = self.out.sinks  # the front-door sessions (open_session adds them)
        hooks = SessionHooks(
            state=lambda: self.st,
            install=self._install,
            serve=self._loop,
            reap_aborted=self._reap_aborted,
            fail_all=self._fail_all,
            flush=self._flush,
            refuse=self._refuse,
            live_rids=lambda: self.by_rid,
        )
        link = ModelLink(cfg.model_address, probe_s=cfg.model_probe_s)
        self.model = ModelSession(cfg, link, self.feed, self.early, self.wake, hooks)

    # -- front door ---------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        # What needs no model fails at once, also while submissions are held for one.
        validate_form(req, self.cfg.max_top_logprobs)
        st = self.st
        if st is None:
            self.early.add(req)  # validated fully and queued when the model first connects
            return
        if self.model.hold_expired:
            raise SubmitError(
                Status.UNAVAILABLE,
                f"the model service has been unreachable for more than {self.cfg.model_hold_s:g}"
                " s; retry later",
            )
        box = st.outboxes.get(req.session)
        check_unique(req, self.by_rid, box.live if box is not None else ())
        info = self.model.info
        assert info is not None
        validate_submit(req, self._limits(st, info))
        req.end_with_grammar(info.eos_token_ids)
        if len(st.waiting) >= self.cfg.max_queue:
            raise SubmitError(
                Status.RESOURCE_EXHAUSTED,
                f"the waiting queue is full ({self.cfg.max_queue}); retry later",
            )
        self.by_rid[req.rid] = req
        req.outbox = st.outbox(req.session)
        req.outbox.live.add(req.key)
        st.waiting.append(req)
        log.debug("request_queued", rid=req.rid, prompt_tokens=len(req.prompt))
        self.wake.set()
        self.out.submitted(req)

    def _limits(self, st: SchedState, info: WorkerInfo) -> SubmitLimits:
        return SubmitLimits(
            vocab_size=int(info.vocab_size),
            context_length=st.context_length,
            kv_capacity=st.cache.allocator.capacity,
            max_top_logprobs=self.cfg.max_top_logprobs,
            image_tokens=info.image_tokens,
            image_geometry=info.image_geometry,
        )

    def abort(self, rid: str, session: str | None = None) -> bool:
        """Abort `rid`; with `session`, only if that session submitted it (ids are the
        clients' own and may collide across sessions)."""
        if self.st is None:
            return self.early.remove(rid, session)
        req = self.by_rid.get(rid)
        if req is None or (session is not None and req.session != session):
            return False
        req.aborted = True
        self.aborted.add(rid)
        self.wake.set()
        return True

    # -- the links' interface (scheduler_service.interface.SchedulerInterface) ---------------
    def open_session(self, session_id: str, sink: Sink) -> SessionOpening:
        if session_id in self.sinks:  # never hand a live session's output to another caller
            raise SessionInUse(session_id)
        self.sinks[session_id] = sink
        # Taken with the sink registered and nothing in between: every later change reaches
        # this session through the sink, after this snapshot.
        info = self.model.info
        return SessionOpening(
            session_id=session_id,
            kv_capacity=info.kv_capacity if info else 0,
            context_length=info.context_length if info else 0,
            cache_block_tokens=self.feed.block_tokens,
            instance_id=self.instance_id,
            feed=self.feed.opening(self.st),
        )

    def close_session(self, session_id: str) -> None:
        self.early.drop_session(session_id)
        for r in list(self.by_rid.values()):
            if r.session == session_id:
                r.aborted = True
                self.aborted.add(r.rid)
        self.sinks.pop(session_id, None)
        self.wake.set()

    def is_running(self, rid: str) -> bool:
        return rid in self.by_rid

    async def compile_grammar(self, kind: str, text: str) -> tuple[bool, str]:
        return await self.grammar.compile(kind, text)

    def flush_cache(self) -> FlushOutcome:
        st = self.st
        if st is None:
            return FlushOutcome(False, message="the scheduler is not started yet")
        busy = len(st.waiting) + len(st.running)
        if busy:
            return FlushOutcome(
                False, message=f"{busy} requests are waiting or running; flush when idle"
            )
        freed = st.cache.flush()  # the host tier too: nothing is saved on the way out
        self.wake.set()  # an idle loop flushes once: front doors hear of the evictions
        log.info("cache_flushed", evicted_tokens=freed)
        return FlushOutcome(True, evicted_tokens=freed)

    def snapshot(self) -> SchedulerSnapshot | None:
        return self.st.snapshot() if self.st is not None else None

    # -- loop ---------------------------------------------------------------------------------
    async def run(self, health: Health) -> None:
        grammar = asyncio.create_task(self.grammar.run())
        try:
            await self.model.run(health)
        except Exception as exc:
            # Not expected (the model session contains step errors): never die silently while health
            # says SERVING.
            log.exception("scheduler_loop_died", error=repr(exc))
            await health.set_ready(False, f"scheduler loop died: {exc!r}")
            raise
        finally:
            grammar.cancel()

    def _rebind_grammars(self, handles: list[int]) -> None:
        """These handles' matchers are gone (their grammar service was lost): bind each
        constrained running request among them again, replaying its output so far, in place of
        its pending operations. The next mask step places it on a connected service."""
        st = self.st
        if st is None:
            return
        ops = st.grammar_ops
        for h in handles:
            r = st.running.get(h)
            if r is None or r.grammar is None:
                continue  # released meanwhile (its release goes nowhere), or reused
            ops.accepts.pop(h, None)
            ops.rollbacks.pop(h, None)
            ops.bind(h, r.grammar[0], r.grammar[1], r.output, rid=r.rid)
        self.wake.set()

    def _refuse(self, r: Request, exc: SubmitError) -> None:
        """End a request that never reached the queue: its whole output is the error."""
        sink = self.sinks.get(r.session)
        if sink is not None:
            sink(error_batch(r.key, r.rid, int(exc.code), str(exc)))

    async def _idle(self, link: ModelLink) -> None:
        self.wake.clear()
        closed = asyncio.create_task(link.closed.wait())
        woken = asyncio.create_task(self.wake.wait())
        await asyncio.wait({closed, woken}, return_when=asyncio.FIRST_COMPLETED)
        closed.cancel()
        woken.cancel()
        if link.closed.is_set():
            raise ModelUnavailable("model service lost")

    async def _loop(self, link: ModelLink) -> None:
        """Build, send, apply. With overlap, step N+1 is built and sent before N's result
        comes back (at most two steps in flight): the worker queues N+1 behind N, so the GPU
        does not wait for this loop or the gRPC hop. Late masks of a step go out as soon as
        every earlier result is applied."""
        st = self.st
        assert st is not None
        depth = 2 if self.cfg.overlap == "on" else 1
        inflight: deque[tuple[PlannedStep, asyncio.Future[StepOutcome]]] = deque()
        prog = self.progress
        prog.begin()
        try:
            await self._steps(st, link, depth, inflight)
        finally:
            prog.end()

    async def _steps(
        self,
        st: SchedState,
        link: ModelLink,
        depth: int,
        inflight: deque[tuple[PlannedStep, asyncio.Future[StepOutcome]]],
    ) -> None:
        prog = self.progress
        while True:
            prog.beat()
            self._reap_aborted()
            sent = False
            if len(inflight) < depth and (st.waiting or st.running):
                t0 = time.perf_counter()
                st.grammar_up = self.grammar.up.is_set()
                plan = self.builder.build()
                st.stats.step_seconds += time.perf_counter() - t0
                await self.masks.before_send(plan)
                if not plan.empty or plan.ops.releases or plan.ops.copies:
                    plan.sent_at = time.perf_counter()
                    inflight.append((plan, link.send(plan.ops)))
                    sent = True
                    if plan.ops.masks_follow and len(inflight) == 1:
                        link.send_masks(await self.masks.after_send(plan))
            if not inflight:
                self._flush(idle=True)
                prog.end()  # idle is not stuck
                try:
                    await self._idle(link)
                finally:
                    prog.begin()
                continue
            if sent and len(inflight) < depth:
                continue  # room for one more step before waiting on the oldest
            plan, fut = inflight.popleft()
            prog.end()  # waiting on the model is its watchdog's business (and the prober's)
            try:
                res = await fut
            finally:
                prog.begin()
            t1 = time.perf_counter()
            if res.error:  # the worker refused or failed it: only its requests fail
                fail_step(st, plan, res.error, self._fail)
            else:
                apply_result(st, plan, res)
            st.stats.steps += 1
            t2 = time.perf_counter()
            st.stats.step_seconds += t2 - t1
            if self.metrics is not None:
                self.metrics.observe_step(t2 - plan.sent_at, len(plan.owners))
            if inflight and inflight[0][0].ops.masks_follow:
                link.send_masks(await self.masks.after_send(inflight[0][0]))
            if self.cfg.debug_invariants:
                st.check_integrity()
            self._flush()

    def _install(self, st: SchedState, info: WorkerInfo) -> None:
        """The model session's state for a new session (a new one, or ours reset)."""
        if st is not self.st and self.metrics is not None:
            st.on_admit = self.metrics.queue_time.observe
        self.st = st
        self._revalidate_waiting(st, info)
        budget = ChunkBudget.resolve(
            self.cfg.chunk_tokens, self.cfg.decode_chunk_tokens, info.device
        )
        self.builder = BatchBuilder(self.cfg, st, self.policy, budget)
        self.masks = StepMasks(self.cfg, st, self.grammar, self._fail)
        for r in self.early.take():
            try:
                self.submit(r)
            except SubmitError as exc:
                self._refuse(r, exc)

    def _revalidate_waiting(self, st: SchedState, info: WorkerInfo) -> None:
        """Held work was validated against the previous model: one with a smaller window or
        pool could never admit some of it, which would then wait forever. Those fail now."""
        lim = self._limits(st, info)
        for r in list(st.waiting):
            try:
                validate_submit(r, lim)
            except SubmitError as exc:
                st.waiting.remove(r)
                self._fail(r, exc.code, f"the model service came back with other limits: {exc}")

    def _fail_all(self, code: Status, message: str) -> None:
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

    def _fail(self, r: Request, code: Status, message: str) -> None:
        st = self.st
        assert st is not None
        st.release(r, insert=False)
        ex = st.extra(r)
        ex.error_code = int(code)
        ex.error_message = message

    def _flush(self, idle: bool = False) -> None:
        if self.st is not None:
            self.out.flush(self.st, self.by_rid, idle)
