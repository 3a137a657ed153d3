"""The scheduler's model-session lifecycle: connect to the model service with backoff, build
the state and cache for the session (a new pool, or the same one reset), revalidate held work
against the model that came back, serve the step loop until the model is lost, then requeue
running work as continuations and hold submissions within --model-hold-s.

These are the Scheduler's own methods kept in a module of their own, as a base class rather
than a second object: the loop's state (`st`, `info`, the hold) keeps one owner, the Scheduler,
and the step path calls them with no extra hop. What they use of the Scheduler is declared
below (the attributes `Scheduler.__init__` sets, and the step-loop and front-door methods it
defines); nothing here runs per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import structlog

from radixmesh_wire.step_ops import WorkerInfo
from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.prefix_cache import make_prefix_cache
from scheduler_service.config import SchedulerConfig
from scheduler_service.continuations import requeue_running
from scheduler_service.grammar.pool import GrammarPool
from scheduler_service.grammar.step_masks import StepMasks
from scheduler_service.links.model import ModelLink, ModelUnavailable
from scheduler_service.metrics import SchedulerMetrics
from scheduler_service.planner.batch_builder import BatchBuilder
from scheduler_service.planner.chunk_budget import ChunkBudget
from scheduler_service.planner.policy import SchedulePolicy
from scheduler_service.request import Request
from scheduler_service.sessions.replica_feed import ReplicaFeed
from scheduler_service.startup_hold import StartupHold
from scheduler_service.state import SchedState
from scheduler_service.status import Status
from scheduler_service.submit_validation import SubmitError, SubmitLimits, validate_submit
from services.reconnect import reconnect_forever
from services.server import Health

log = structlog.get_logger(__name__)


class ModelSessions:
    """The Scheduler's base: its model-session half (see the module docstring)."""

    # Set by Scheduler.__init__ (builder and masks: by _on_connected, for each session).
    cfg: SchedulerConfig
    link: ModelLink
    grammar: GrammarPool
    policy: SchedulePolicy
    st: SchedState | None
    info: WorkerInfo | None
    by_rid: dict[str, Request]
    wake: asyncio.Event
    down_since: float | None
    hold_expired: bool
    metrics: SchedulerMetrics | None
    early: StartupHold
    feed: ReplicaFeed
    builder: BatchBuilder
    masks: StepMasks
    # Defined by the Scheduler: the front door's side and the step loop.
    submit: Callable[[Request], None]
    _limits: Callable[[SchedState, WorkerInfo], SubmitLimits]
    _refuse: Callable[[Request, SubmitError], None]
    _loop: Callable[[], Awaitable[None]]
    _reap_aborted: Callable[[], None]
    _fail: Callable[[Request, Status, str], None]
    _flush: Callable[..., None]

    async def _run_model(self, health: Health) -> None:
        last_error = ""

        async def attempt() -> bool:
            nonlocal last_error
            try:
                info = await self.link.connect()
            except ModelUnavailable as exc:
                if str(exc) != last_error:  # once per distinct reason, not every retry
                    last_error = str(exc)
                    log.warning("model_connect_failed", error=last_error)
                await health.set_ready(False, str(exc))
                return False
            last_error = ""
            await self._serve_model(info, health)
            return True

        # A lost session is reconnected at once; failed connects back off (waking for aborts).
        await reconnect_forever(attempt, wait=self._wait_down, pause_after_success=False)

    async def _serve_model(self, info: WorkerInfo, health: Health) -> None:
        """One model session, from connected to lost (or reset after a scheduler bug)."""
        self._on_connected(info)
        if self.down_since is not None:
            held = len(self.st.waiting) if self.st else 0
            log.info("model_back", down_s=round(time.monotonic() - self.down_since, 2), held=held)
        self.down_since, self.hold_expired = None, False
        await health.set_ready(True, "model connected")
        try:
            await self._loop()
        except ModelUnavailable as exc:
            await health.set_ready(False, str(exc))
            self._on_model_lost(str(exc))
            await self.link.close()
        except Exception as exc:  # noqa: BLE001 - a bug must not end the service
            # Steps in flight no longer match our state: fail the work in hand, then start
            # a fresh model session (the worker drops its state) and keep serving.
            log.exception("scheduler_step_crashed", error=repr(exc), rids=sorted(self.by_rid)[:32])
            await health.set_ready(False, f"scheduler step crashed, resetting: {exc!r}")
            self._fail_all(Status.INTERNAL, f"scheduler error: {type(exc).__name__}: {exc}")
            await self.link.close()

    def _on_model_lost(self, reason: str) -> None:
        st = self.st
        assert st is not None
        self.down_since = time.monotonic()
        requeued = requeue_running(st)
        log.warning("model_lost", reason=reason, requeued=len(requeued), held=len(st.waiting))
        self._flush(idle=True)  # output applied before the loss still reaches the front door

    async def _wait_down(self, seconds: float) -> None:
        """While the model is away: reap aborts (a client may leave meanwhile) and enforce the
        hold bound, waking early for aborts."""
        self.wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.wake.wait(), seconds)
        if self.st is None:
            if self.early and self.early.expired():
                msg = (
                    f"the model service has not connected in {self.cfg.model_hold_s:g} s since"
                    " the scheduler started (--model-hold-s); retry later"
                )
                for r in self.early.take():
                    self._refuse(r, SubmitError(Status.UNAVAILABLE, msg))
            return
        self._reap_aborted()
        if self.down_since is not None and not self.hold_expired:
            down = time.monotonic() - self.down_since
            if down > self.cfg.model_hold_s:
                self.hold_expired = True
                msg = (
                    f"the model service has been unreachable for {down:.0f} s "
                    f"(--model-hold-s={self.cfg.model_hold_s:g}); retry later"
                )
                log.warning("model_hold_expired", held=len(self.st.waiting), down_s=round(down))
                self._fail_all(Status.UNAVAILABLE, msg)
        self._flush(idle=True)

    def _host_capacity(self, info: WorkerInfo) -> int:
        """Host KV tier slots: the smaller of ours and the model service's (issue 31)."""
        want = self.cfg.host_kv_tokens
        if want and not info.host_kv_capacity:
            log.warning(
                "host_kv_tier_off",
                reason="the model service has no host KV pool: start it with --host-kv-tokens",
            )
        return min(want, info.host_kv_capacity)

    def _on_connected(self, info: WorkerInfo) -> None:
        self.info = info
        cap = info.kv_capacity
        host_cap = self._host_capacity(info)
        old = st = self.st
        if (
            old is None
            or old.cache.allocator.capacity != cap
            or getattr(getattr(old.cache, "host", None), "capacity", 0) != host_cap
        ):
            alloc = SlotAllocator(cap, track_freed=info.nan_fill)
            st = self.st = SchedState(
                cache=make_prefix_cache(
                    self.cfg.radix,
                    alloc,
                    eviction=self.cfg.eviction,
                    protect_s=self.cfg.protect_ms / 1e3,
                    observer=self.feed.publisher,
                    host_capacity=host_cap,
                    host_write=self.cfg.host_tier_write,
                ),
                context_length=info.context_length,
            )
            if old is not None:  # a model back with another pool size: held work carries over
                st.waiting, st.outboxes, st.stats = old.waiting, old.outboxes, old.stats
                st.grammar_ops = old.grammar_ops
            if self.metrics is not None:
                st.on_admit = self.metrics.queue_time.observe
            if self.feed.publisher is not None:
                self.feed.publisher.reset()  # the old tree is gone with its blocks
        else:
            assert st is not None
            st.cache.reset()  # new session: the worker's KV pool content is gone
            st.handles.reset()
            st.pending_release.clear()
        st.context_length = info.context_length
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
