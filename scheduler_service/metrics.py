"""Scheduler metrics: queue and running gauges, KV token usage, cache hit rate and token
counters are read from `SchedState` at scrape time; per-step round trip, batch size and
per-request queue time are histograms observed once per step / once per admission."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry

from scheduler_service.cache.host_tier import HostTier
from scheduler_service.state import SchedState
from services.metrics import (
    BATCH_BUCKETS,
    LATENCY_BUCKETS,
    STEP_BUCKETS,
    Reading,
    ServiceMetrics,
)


class SchedulerMetrics(ServiceMetrics):
    def __init__(
        self,
        state: Callable[[], SchedState | None],
        max_running: int,
        registry: CollectorRegistry | None = None,
        cache_blocks: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(registry)
        self._state = state
        self._max_running = max_running
        self._cache_blocks = cache_blocks  # blocks published to the front doors
        self.queue_time = self.histogram(
            "queue_time_seconds",
            "Time a request waited in the queue before its first admission.",
            LATENCY_BUCKETS,
        )
        self.step_time = self.histogram(
            "scheduler_step_seconds",
            "Round trip of one step: sent to the model service until its result is applied.",
            STEP_BUCKETS,
        )
        self.batch_size = self.histogram(
            "scheduler_batch_size", "Rows (requests) in one step.", BATCH_BUCKETS
        )
        self.readings(self._read)

    def observe_step(self, seconds: float, rows: int) -> None:
        self.step_time.observe(seconds)
        self.batch_size.observe(rows)

    def _read(self) -> Iterator[Reading]:
        yield Reading(
            "max_running_requests", "gauge", "Most requests decoding at once.", self._max_running
        )
        st = self._state()
        if st is None:  # not connected to a model service yet: no pool, no counters
            return
        cache, s = st.cache, st.stats
        cap = cache.allocator.capacity
        yield Reading(
            "num_running_reqs", "gauge", "Requests admitted and running.", len(st.running)
        )
        yield Reading("num_queue_reqs", "gauge", "Requests waiting for admission.", len(st.waiting))
        yield Reading("max_total_num_tokens", "gauge", "KV pool capacity in tokens.", cap)
        used = 1 - cache.free_size / cap if cap else 0.0
        yield Reading("token_usage", "gauge", "Fraction of KV slots not free.", used)
        yield Reading(
            "cache_hit_rate",
            "gauge",
            "Prompt tokens served from the prefix cache.",
            s.cache_hit_rate,
        )
        yield Reading("prompt_tokens", "counter", "Prompt tokens admitted.", s.prompt_tokens)
        yield Reading(
            "cached_tokens",
            "counter",
            "Prompt tokens served from the prefix cache.",
            s.cached_prompt_tokens,
        )
        yield Reading("generation_tokens", "counter", "Tokens generated.", s.generated_tokens)
        yield Reading("finished_requests", "counter", "Requests finished.", s.finished_requests)
        yield Reading("retractions", "counter", "Requests retracted for KV.", s.retractions)
        yield Reading("scheduler_steps", "counter", "Steps applied.", s.steps)
        yield Reading(
            "scheduler_cpu_seconds",
            "counter",
            "Scheduler time building and applying steps.",
            s.step_seconds,
        )
        yield Reading(
            "mask_wait_seconds",
            "counter",
            "Time steps waited for grammar masks.",
            s.mask_wait_seconds,
        )
        yield Reading(
            "evicted_tokens", "counter", "Prefix-cache tokens evicted.", cache.stats.evicted_tokens
        )
        yield from host_tier_readings(getattr(cache, "host", None))
        if self._cache_blocks is not None:
            yield Reading(
                "cache_blocks",
                "gauge",
                "Prefix-cache blocks published to the front doors (0: publishing none).",
                self._cache_blocks(),
            )


def host_tier_readings(host: HostTier | None) -> Iterator[Reading]:
    """The host-memory KV tier's readings (issue 31); none without a tier."""
    if host is None:
        return
    h = host.stats
    yield Reading("host_kv_tokens", "gauge", "Host KV tier capacity in tokens.", host.capacity)
    yield Reading("host_kv_used_tokens", "gauge", "Host KV slots holding cached KV.", host.held)
    yield Reading(
        "host_hit_tokens", "counter", "Prompt tokens served from the host tier.", h.host_hit_tokens
    )
    yield Reading(
        "host_saved_tokens", "counter", "KV tokens copied GPU to host (eviction).", h.saved_tokens
    )
    yield Reading(
        "host_loaded_tokens", "counter", "KV tokens copied host to GPU (hits).", h.loaded_tokens
    )
    yield Reading(
        "host_evicted_tokens",
        "counter",
        "Host KV tokens dropped by the host tier's LRU.",
        h.host_evicted_tokens,
    )
    yield Reading(
        "host_written_through_tokens",
        "counter",
        "Of the tokens copied GPU to host, those copied by write-through.",
        h.written_through_tokens,
    )
    yield Reading("host_copy_steps", "counter", "Steps that carried KV copies.", h.copy_steps)
    yield Reading("host_copy_ops", "counter", "KV copy ops sent to the model.", h.copy_ops)
    yield Reading(
        "host_undone_tokens",
        "counter",
        "KV slots of either tier dropped from the cache: a step carrying their copy failed.",
        h.undone_tokens,
    )
    yield Reading(
        "host_load_waits",
        "counter",
        "Admissions that joined a batch one step later, while their prefix was loaded.",
        h.load_waits,
    )
    yield Reading(
        "host_loading_requests",
        "gauge",
        "Requests admitted in the last step built whose prefix that step loads (they join "
        "the next).",
        h.loading_requests,
    )
    yield Reading(
        "host_max_step_copy_tokens",
        "gauge",
        "Most KV tokens one step copied between the tiers.",
        h.max_step_copy_tokens,
    )
