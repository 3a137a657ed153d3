"""What every front-door session hears besides its own requests' output: this replica's prefix
cache changes and its load, which front doors route on (scale-out, issue 16). No protobuf here:
frontend_link turns a `Feed` into the message's `cache` and `load` fields.

Batching: the scheduler collects one `Feed` per flush (after a step's results are applied) and
attaches it to every session's message of that flush, so cache changes cost one message per
step at most, however many blocks moved. Load is recomputed at most every `load_interval_s`,
and never sooner than `load_cost_factor` times its own last cost (it walks the waiting queue:
~0.25 ms for 1,000 waiting requests, so the walk takes at most ~2 % of the loop), and sent only
when it changed; a flush before the loop goes idle always looks, so the last load before a
quiet spell is never held back.

A session opening gets `opening()`: a reset with the whole held set, and the current load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from time import monotonic, perf_counter
from typing import TYPE_CHECKING

from radixmesh_wire.cache_blocks import BLOCK_TOKENS
from scheduler_service.cache_publisher import CacheDelta, CachePublisher

if TYPE_CHECKING:
    from scheduler_service.state import SchedState

LOAD_INTERVAL_S = 0.005
LOAD_COST_FACTOR = 50.0


@dataclass(frozen=True, slots=True)
class Load:
    """A `LoadReport`."""

    waiting_requests: int
    running_requests: int
    # Per waiting request: tokens not yet known to be cached (its last match, else all of
    # them) plus its max_new_tokens still to generate.
    waiting_tokens: int
    running_tokens: int  # KV tokens the running requests' sequences span (shared ones per request)
    kv_capacity: int
    kv_free: int  # free + evictable: what admission can still use


@dataclass(frozen=True, slots=True)
class Feed:
    cache: CacheDelta | None
    load: Load | None


def load_of(st: SchedState) -> Load:
    waiting_tokens = 0
    for r in st.waiting:  # inlined Request.remaining: this runs for every waiting request
        m = r.match
        left = r.spec.max_new_tokens - len(r.output)
        waiting_tokens += len(r.fill) - (m.length if m is not None else 0) + max(left, 0)
    c = st.cache
    return Load(
        waiting_requests=len(st.waiting),
        running_requests=len(st.running),
        waiting_tokens=waiting_tokens,
        running_tokens=sum(len(r.kv_slots) for r in st.running.values()),
        kv_capacity=c.allocator.capacity,
        kv_free=c.free_size + c.evictable_size,
    )


class ReplicaFeed:
    """Collects a flush's `Feed`: the publisher's drained cache changes (``publisher`` None:
    this scheduler publishes none) and the load when it changed."""

    def __init__(
        self,
        publisher: CachePublisher | None,
        *,
        load_interval_s: float = LOAD_INTERVAL_S,
        load_cost_factor: float = LOAD_COST_FACTOR,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self.publisher = publisher
        self.load_interval_s = load_interval_s
        self.load_cost_factor = load_cost_factor
        self._clock = clock
        self._next_load = float("-inf")  # no load computed before this clock() time
        self._last_load: Load | None = None  # the last one sent

    @property
    def block_tokens(self) -> int:
        """The hello's `cache_block_tokens`: 0 when publishing nothing."""
        return BLOCK_TOKENS if self.publisher is not None else 0

    def published_blocks(self) -> int:
        """Blocks this replica holds and publishes (the metrics gauge; 0 when publishing none)."""
        return 0 if self.publisher is None else self.publisher.block_count

    def collect(self, st: SchedState, *, force_load: bool = False) -> Feed | None:
        cache = self.publisher.drain() if self.publisher is not None else None
        load = None
        now = self._clock()
        if force_load or now >= self._next_load:
            t0 = perf_counter()
            current = load_of(st)
            cost = perf_counter() - t0
            self._next_load = now + max(self.load_interval_s, self.load_cost_factor * cost)
            if current != self._last_load:
                load = self._last_load = current
        if cache is None and load is None:
            return None
        return Feed(cache, load)

    def opening(self, st: SchedState | None) -> Feed:
        """A new session's first feed: everything held (a reset) and the current load."""
        cache = self.publisher.snapshot() if self.publisher is not None else None
        return Feed(cache, load_of(st) if st is not None else None)
