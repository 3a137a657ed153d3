"""The scheduler's model-session lifecycle: connect to the model service with backoff, build
the state and cache for the session (a new pool, or the same one reset), serve the step loop
until the model is lost, then requeue running work as continuations and hold submissions
within --model-hold-s.

`ModelSession` is an object the Scheduler holds. It owns the link and what is known of the
model (`info`, `down_since`, `hold_expired`); the Scheduler keeps its state, queues and step
loop, and the session asks it for what it must do through `SessionHooks` (take the state,
run the step loop on the link, fail all, flush, ...). Nothing here runs per step: the step
loop gets the link as an argument.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import structlog

from radixmesh_wire.step_ops import WorkerInfo
from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.prefix_cache import make_prefix_cache
from scheduler_service.config import SchedulerConfig
from scheduler_service.continuations import requeue_running
from scheduler_service.links.model import ModelLink, ModelUnavailable
from scheduler_service.request import Request
from scheduler_service.sessions.replica_feed import ReplicaFeed
from scheduler_service.startup_hold import StartupHold
from scheduler_service.state import SchedState
from scheduler_service.status import Status
from scheduler_service.submit_validation import SubmitError
from services.reconnect import reconnect_forever
from services.server import Health

log = structlog.get_logger(__name__)

__all__ = ["ModelSession", "SessionHooks"]


@dataclass(frozen=True)
class SessionHooks:
    """What a model session asks of the scheduler it serves (the scheduler's own methods)."""

    state: Callable[[], SchedState | None]  # the scheduler's state now (None: never connected)
    # A session's state is built (new, or the old one reset): take it, revalidate held work
    # against `info`, and queue the submissions held since start.
    install: Callable[[SchedState, WorkerInfo], None]
    serve: Callable[[ModelLink], Awaitable[None]]  # the step loop, until the link is lost
    reap_aborted: Callable[[], None]
    fail_all: Callable[[Status, str], None]  # fail every queued and running request
    flush: Callable[[bool], None]  # hand output to the front doors (the argument: idle)
    refuse: Callable[[Request, SubmitError], None]  # end a request that never was queued
    live_rids: Callable[[], Iterable[str]]  # the requests in hand (for a crash's log)


class ModelSession:
    """Connects to the model service, and serves it one session at a time, forever."""

    def __init__(
        self,
        cfg: SchedulerConfig,
        link: ModelLink,
        feed: ReplicaFeed,
        early: StartupHold,
        wake: asyncio.Event,
        hooks: SessionHooks,
    ) -> None:
        self.cfg = cfg
        self.link = link
        self.info: WorkerInfo | None = None  # the model of the last session
        self.down_since: float | None = None  # when the model was lost (None: connected)
        self.hold_expired = False  # held past --model-hold-s: refuse until the model is back
        self._feed = feed
        self._early = early  # the scheduler's submissions before the first session
        self._wake = wake  # the scheduler's wake-up (set on aborts and submissions)
        self._hooks = hooks

    async def run(self, health: Health) -> None:
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
            await self.serve(info, health)
            return True

        # A lost session is reconnected at once; failed connects back off (waking for aborts).
        await reconnect_forever(attempt, wait=self.wait_down, pause_after_success=False)

    async def serve(self, info: WorkerInfo, health: Health) -> None:
        """One model session, from connected to lost (or reset after a scheduler bug)."""
        self.connected(info)
        if self.down_since is not None:
            st = self._hooks.state()
            held = len(st.waiting) if st else 0
            log.info("model_back", down_s=round(time.monotonic() - self.down_since, 2), held=held)
        self.down_since, self.hold_expired = None, False
        await health.set_ready(True, "model connected")
        try:
            await self._hooks.serve(self.link)
        except ModelUnavailable as exc:
            await health.set_ready(False, str(exc))
            self.lost(str(exc))
            await self.link.close()
        except Exception as exc:  # noqa: BLE001 - a bug must not end the service
            # Steps in flight no longer match our state: fail the work in hand, then start
            # a fresh model session (the worker drops its state) and keep serving.
            rids = sorted(self._hooks.live_rids())[:32]
            log.exception("scheduler_step_crashed", error=repr(exc), rids=rids)
            await health.set_ready(False, f"scheduler step crashed, resetting: {exc!r}")
            self._hooks.fail_all(Status.INTERNAL, f"scheduler error: {type(exc).__name__}: {exc}")
            await self.link.close()

    def lost(self, reason: str) -> None:
        st = self._hooks.state()
        assert st is not None
        self.down_since = time.monotonic()
        requeued = requeue_running(st)
        log.warning("model_lost", reason=reason, requeued=len(requeued), held=len(st.waiting))
        self._hooks.flush(True)  # output applied before the loss still reaches the front door

    async def wait_down(self, seconds: float) -> None:
        """While the model is away: reap aborts (a client may leave meanwhile) and enforce the
        hold bound, waking early for aborts."""
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        st = self._hooks.state()
        if st is None:
            if self._early and self._early.expired():
                msg = (
                    f"the model service has not connected in {self.cfg.model_hold_s:g} s since"
                    " the scheduler started (--model-hold-s); retry later"
                )
                for r in self._early.take():
                    self._hooks.refuse(r, SubmitError(Status.UNAVAILABLE, msg))
            return
        self._hooks.reap_aborted()
        if self.down_since is not None and not self.hold_expired:
            down = time.monotonic() - self.down_since
            if down > self.cfg.model_hold_s:
                self.hold_expired = True
                msg = (
                    f"the model service has been unreachable for {down:.0f} s "
                    f"(--model-hold-s={self.cfg.model_hold_s:g}); retry later"
                )
                log.warning("model_hold_expired", held=len(st.waiting), down_s=round(down))
                self._hooks.fail_all(Status.UNAVAILABLE, msg)
        self._hooks.flush(True)

    def host_capacity(self, info: WorkerInfo) -> int:
        """Host KV tier slots: the smaller of ours and the model service's (issue 31)."""
        want = self.cfg.host_kv_tokens
        if want and not info.host_kv_capacity:
            log.warning(
                "host_kv_tier_off",
                reason="the model service has no host KV pool: start it with --host-kv-tokens",
            )
        return min(want, info.host_kv_capacity)

    def connected(self, info: WorkerInfo) -> None:
        """The state for a new session: a new one when the pool's size changed (held work
        carries over), else the old one reset (the worker's KV pool content is gone)."""
        self.info = info
        cap = info.kv_capacity
        host_cap = self.host_capacity(info)
        old = st = self._hooks.state()
        if (
            old is None
            or old.cache.allocator.capacity != cap
            or getattr(getattr(old.cache, "host", None), "capacity", 0) != host_cap
        ):
            alloc = SlotAllocator(cap, track_freed=info.nan_fill)
            st = SchedState(
                cache=make_prefix_cache(
                    self.cfg.radix,
                    alloc,
                    eviction=self.cfg.eviction,
                    protect_s=self.cfg.protect_ms / 1e3,
                    observer=self._feed.publisher,
                    host_capacity=host_cap,
                    host_write=self.cfg.host_tier_write,
                ),
                context_length=info.context_length,
            )
            if old is not None:  # a model back with another pool size: held work carries over
                st.waiting, st.outboxes, st.stats = old.waiting, old.outboxes, old.stats
                st.grammar_ops = old.grammar_ops
            if self._feed.publisher is not None:
                self._feed.publisher.reset()  # the old tree is gone with its blocks
        else:
            assert st is not None
            st.cache.reset()  # new session: the worker's KV pool content is gone
            st.handles.reset()
            st.pending_release.clear()
        st.context_length = info.context_length
        self._hooks.install(st, info)
