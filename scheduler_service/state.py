"""The scheduler's mutable state, shared by the step builder and the output processor.

Accounting invariant (checked after every step in debug mode):
  free + evictable + locked + sum(request-owned slots of admitted requests) == capacity
and a request admitted while its prefix loads (``Phase.LOADING``) owns no slots: its KV is its
locked cached prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler_service.cache.prefix_cache import PrefixCache
from scheduler_service.grammar.ops import GrammarOps
from scheduler_service.handles import HandlePool
from scheduler_service.request import Phase, Request
from scheduler_service.sessions.outbox import Extra, Outbox
from scheduler_service.stats import SchedulerSnapshot, SchedulerStats


@dataclass
class SchedState:
    cache: PrefixCache
    context_length: int
    waiting: list[Request] = field(default_factory=list)
    running: dict[int, Request] = field(default_factory=dict)  # by handle
    handles: HandlePool = field(default_factory=HandlePool)
    stats: SchedulerStats = field(default_factory=SchedulerStats)
    outboxes: dict[str, Outbox] = field(default_factory=dict)  # session -> pending output
    pending_release: list[int] = field(default_factory=list)  # handles to release next step
    grammar_ops: GrammarOps = field(default_factory=GrammarOps)
    grammar_up: bool = False  # constrained requests run only while the grammar link is up
    step_id: int = 0
    # Called with a request's queue time at its first admission (metrics); None: off.
    on_admit: Callable[[float], None] | None = None

    def outbox(self, session: str) -> Outbox:
        box = self.outboxes.get(session)
        if box is None:
            box = self.outboxes[session] = Outbox(session)
        return box

    def extra(self, req: Request) -> Extra:
        """The request's rare output of this step (logprobs, finish, error, ...)."""
        return req.outbox.extra(req.key, req.rid)

    def runnable(self, req: Request) -> bool:
        return req.grammar is None or self.grammar_up

    def request_owned(self) -> int:
        return sum(r.owned for r in self.running.values())

    def snapshot(self) -> SchedulerSnapshot:
        c, s = self.cache, self.stats
        host = getattr(c, "host", None)  # only the radix tree has a host tier
        tier = (
            {
                "host_kv_capacity": host.capacity,
                "host_kv_used": host.held,
                "host_hit_tokens": host.stats.host_hit_tokens,
                "host_saved_tokens": host.stats.saved_tokens,
                "host_loaded_tokens": host.stats.loaded_tokens,
                "host_evicted_tokens": host.stats.host_evicted_tokens,
            }
            if host is not None
            else {}
        )
        return SchedulerSnapshot(
            queue_length=len(self.waiting),
            running_requests=len(self.running),
            kv_capacity=c.allocator.capacity,
            kv_free=c.free_size,
            kv_evictable=c.evictable_size,
            kv_locked=c.locked_size,
            kv_request_owned=self.request_owned(),
            cache_hit_rate=s.cache_hit_rate,
            prompt_tokens=s.prompt_tokens,
            cached_prompt_tokens=s.cached_prompt_tokens,
            generated_tokens=s.generated_tokens,
            evicted_tokens=c.stats.evicted_tokens,
            finished_requests=s.finished_requests,
            retractions=s.retractions,
            steps=s.steps,
            radix_seconds=c.stats.bookkeeping_seconds,
            mask_wait_seconds=s.mask_wait_seconds,
            jump_forwards=s.jump_forwards,
            jump_forward_tokens=s.jump_forward_tokens,
            **tier,
        )

    def check_integrity(self) -> None:
        self.cache.check_integrity(self.request_owned(), deep=False)
        for r in self.running.values():
            # Load-ahead: a request waiting for its prefix's load holds only its lock.
            if r.phase is Phase.LOADING and (
                r.owned or r.kv_len != r.cached_len or r.node is None or r.pending
            ):
                raise AssertionError(
                    f"request {r.rid} is loading but owns {r.owned} slots, has {r.kv_len} of "
                    f"{r.cached_len} tokens in KV, pending {r.pending}, node {r.node!r}"
                )

    def release(self, req: Request, insert: bool) -> None:
        """Take a request out of the running set. `insert`: its KV enters the prefix cache
        (finished); otherwise its own slots are freed (aborted, failed, retracted)."""
        if req.handle >= 0:
            if req.grammar is not None:
                self.grammar_ops.release(req.handle)
            self.running.pop(req.handle, None)
            self.pending_release.append(req.handle)
        req.release(self.cache, insert)

    def requeue(self, req: Request, insert: bool) -> None:
        """Release a running request and put it back at the head of the queue (retracted,
        or redone after a jump or a lost grammar service); it is matched and admitted again."""
        self.release(req, insert)
        req.requeue()
        self.waiting.insert(0, req)
