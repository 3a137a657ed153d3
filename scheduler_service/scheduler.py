"""The scheduling loop: connect to the model service, then build a step, send it, apply the
result, hand deltas to the front-door sessions; repeat while there is work.

Losing the model service fails every request promptly with UNAVAILABLE, frees its slots,
flushes the prefix cache (the KV pool is gone) and reconnects with backoff.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import structlog

from client.pb import model_pb2
from scheduler_service.allocator import SlotAllocator
from scheduler_service.batch_builder import BatchBuilder, PlannedStep
from scheduler_service.config import SchedulerConfig
from scheduler_service.constrained_rows import constrained_samplers, drop_rows, strip_constrained
from scheduler_service.grammar_link import GrammarLink, GrammarUnavailable
from scheduler_service.model_link import ModelLink, ModelUnavailable
from scheduler_service.output_processor import apply_result
from scheduler_service.policy import SchedulePolicy
from scheduler_service.prefix_cache import make_prefix_cache
from scheduler_service.request import Request
from scheduler_service.state import Delta, SchedState
from services.packing import unpack_i32
from services.server import Health

log = structlog.get_logger(__name__)

Sink = Callable[[list[Delta]], None]


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
        st.sessions[req.rid] = req.session
        st.waiting.append(req)
        self.wake.set()

    def abort(self, rid: str) -> bool:
        req = self.by_rid.get(rid)
        if req is None or self.st is None:
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
        else:
            self.st.cache.reset()  # new session: the worker's KV pool content is gone
            self.st.handles.reset()
            self.st.pending_release.clear()
        self.builder = BatchBuilder(self.cfg, self.st, self.policy)

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
        st = self.st
        assert st is not None
        while True:
            self._reap_aborted()
            if not st.waiting and not st.running:
                self._flush()
                await self._idle()
                continue
            t0 = time.perf_counter()
            st.grammar_up = self.grammar.up.is_set()
            plan = self.builder.build()
            if plan.empty and not plan.msg.release_handles:
                self._flush()
                await self._idle()
                continue
            cpu = time.perf_counter() - t0
            await self._masks(plan)
            res = await self.link.send(plan.msg)
            t1 = time.perf_counter()
            if res.error:
                log.error("step_failed", step=res.step_id, error=res.error)
                for r in [*st.running.values()]:
                    self._fail(r, grpc.StatusCode.INTERNAL, f"model step failed: {res.error}")
            else:
                apply_result(st, plan, res)
            st.stats.steps += 1
            st.stats.step_seconds += cpu + time.perf_counter() - t1
            if self.cfg.debug_invariants:
                st.check_integrity()
            self._flush()

    async def _masks(self, plan: PlannedStep) -> None:
        """Fetch grammar masks for the constrained rows that sample in this step. If the grammar
        service is lost meanwhile, those rows are taken out of the step (they wait for the
        reconnect and its replay) instead of ever being sampled unmasked."""
        st = self.st
        assert st is not None
        want = constrained_samplers(st, plan)
        if not want and not st.grammar_ops:
            return
        if not st.grammar_up:
            strip_constrained(st, plan)
            return
        jump = []
        if self.cfg.jump_forward == "on":
            jump = [h for h in want if st.running[h].no_jump_at != len(st.running[h].output)]
        t0 = time.perf_counter()
        try:
            res = await self.grammar.step(st.grammar_ops.build(plan.msg.step_id, want, jump))
        except GrammarUnavailable:
            st.grammar_up = False
            strip_constrained(st, plan)
            return
        finally:
            st.stats.mask_wait_seconds += time.perf_counter() - t0
        for err in res.errors:
            r = st.running.get(err.handle)
            if r is not None:
                code = (
                    grpc.StatusCode.INVALID_ARGUMENT if err.code == 3 else grpc.StatusCode.INTERNAL
                )
                log.error("grammar_row_failed", rid=r.rid, code=err.code, error=err.message)
                drop_rows(st, plan, {r.handle})
                if r in st.waiting:
                    st.waiting.remove(r)
                self._fail(r, code, f"grammar: {err.message}")
        decoding = set(unpack_i32(plan.msg.decode_handles))
        jumped = set()
        for row in res.rows:
            jf = row.jump_forward
            r = st.running.get(row.handle)
            if r is not None and jf.tokens and row.handle in decoding:
                r.jump = (jf.rollback, unpack_i32(jf.tokens))  # applied by the next build
                jumped.add(row.handle)
        drop_rows(st, plan, jumped)  # a jumping request sits out this step, never raced
        plan.msg.masks.extend(
            row for row in res.rows if row.handle in st.running and row.handle not in jumped
        )

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
            st.delta(r).finish = "abort"

    def _fail(self, r: Request, code: grpc.StatusCode, message: str) -> None:
        st = self.st
        assert st is not None
        st.release(r, insert=False)
        d = st.delta(r)
        d.error_code = code.value[0]
        d.error_message = message

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
        st = self.st
        if st is None or not st.deltas:
            return
        by_session: dict[str, list[Delta]] = {}
        for rid, d in st.deltas.items():
            session = st.sessions.get(rid, "")
            by_session.setdefault(session, []).append(d)
            if d.finish or d.error_code:
                self.by_rid.pop(rid, None)
                st.sessions.pop(rid, None)
        st.deltas = {}
        for session, deltas in by_session.items():
            sink = self.sinks.get(session)
            if sink is not None:
                sink(deltas)
