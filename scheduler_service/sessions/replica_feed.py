"""What every front-door session hears besides its own requests' output: this replica's prefix
cache changes and its load, which front doors route on (scale-out, issue 16). No protobuf here:
links/frontend.py turns a `Feed` into the message's `cache` and `load` fields.

Batching: the scheduler collects one `Feed` per flush (after a step's results are applied) and
attaches it to every session's message of that flush, so cache changes cost one message per
step at most, however many blocks moved. Load is recomputed at most every `load_interval_s`,
and never sooner than `load_cost_factor` times its own last cost (it walks the waiting queue:
~0.25 ms for 1,000 waiting requests, so the walk takes at most ~2 % of the loop), and sent only
when it changed; a flush before the loop goes idle always looks, so the last load before a
quiet spell is never held back.

A session opening gets `opening()`: a reset with the whole held set, and the current load.

Provisional holds: `hold` publishes a submitted request's prompt blocks at once (the scheduler
sends them with `collect_cache` on the next loop turn, not after the step under way) and
`release` withdraws them when it ends, unless the tree holds them by then (cache_publisher).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from time import monotonic, perf_counter
from typing import TYPE_CHECKING

from radixmesh_wire.cache_blocks import BLOCK_TOKENS, block_hashes
from scheduler_service.cache.publisher import CacheDelta, CachePublisher

if TYPE_CHECKING:
    from scheduler_service.request import Request
    from scheduler_service.state import SchedState

LOAD_INTERVAL_S = 0.005
LOAD_COST_FACTOR = 50.0


@dataclass(frozen=True, slots=True)
class Load:
    """A `LoadReport`."""

    waiting_requests: int
    running_requests: int
    # Waiting requests' tokens not yet known to be cached (past each one's last match; a
    # prefix several of them share counted once) plus their output budgets still to generate.
    waiting_tokens: int
    running_tokens: int  # running requests' prompt still to prefill + output budget left
    kv_capacity: int
    kv_free: int  # free + evictable: what admission can still use
    cache_hit_rate: float = 0.0  # prompt tokens served from the prefix cache, since start
    context_length: int = 0  # the model's window (front doors validate prompts against it)


@dataclass(frozen=True, slots=True)
class Feed:
    cache: CacheDelta | None
    load: Load | None


def load_of(st: SchedState, blocks: WaitingBlocks | None = None) -> Load:
    """The replica's load now, as work left in tokens: waiting requests count a prefix that
    several of them share once (a burst of one group's questions is one prefill of its system
    prompt, not one per question); running requests their prompt still to prefill (a chunked
    prefill under way) and their output budget still to generate. KV held is memory, not work:
    a running group's cached system prompt costs nothing more."""
    blocks = blocks if blocks is not None else WaitingBlocks()
    c = st.cache
    running_tokens = 0
    for r in st.running.values():
        left = r.spec.max_new_tokens - len(r.output)
        running_tokens += max(len(r.fill) - r.kv_len, 0) + max(left, 0)
    return Load(
        waiting_requests=len(st.waiting),
        running_requests=len(st.running),
        waiting_tokens=blocks.waiting_tokens(st.waiting),
        running_tokens=running_tokens,
        kv_capacity=c.allocator.capacity,
        kv_free=c.free_size + c.evictable_size,
        cache_hit_rate=st.stats.cache_hit_rate,
        context_length=st.context_length,
    )


class WaitingBlocks:
    """The block hashes (radixmesh_wire.cache_blocks, the ones front doors route on) of each
    waiting request's fill in its cache namespace, remembered per request so a load walk
    hashes only new arrivals; a re-queued request whose fill grew is hashed again."""

    def __init__(self) -> None:
        self._memo: dict[str, tuple[int, list[int]]] = {}

    def remember(self, r: Request, hashes: list[int]) -> None:
        """`hashes` are `r`'s fill's block hashes, computed elsewhere (its provisional hold)."""
        self._memo[r.rid] = (len(r.fill), hashes)

    def _of(self, r: Request) -> list[int]:
        n = len(r.fill)
        got = self._memo.get(r.rid)
        if got is not None and got[0] == n:
            return got[1]
        out = block_hashes(r.cache_keys(n))
        self._memo[r.rid] = (n, out)
        return out

    def waiting_tokens(self, waiting: Iterable[Request]) -> int:
        """Per waiting request: its tokens not known to be cached (past its last match) that
        no earlier waiting request shares, plus its output budget still to generate."""
        seen: set[int] = set()
        live: dict[str, tuple[int, list[int]]] = {}
        total = 0
        for r in waiting:
            hashes = self._of(r)
            live[r.rid] = self._memo[r.rid]
            m = r.match
            start = m.length if m is not None else 0
            first = start // BLOCK_TOKENS
            new = 0
            for i in range(first, len(hashes)):
                h = hashes[i]
                if h not in seen:
                    seen.add(h)
                    new += BLOCK_TOKENS - (start - i * BLOCK_TOKENS if i == first else 0)
            full = len(hashes) * BLOCK_TOKENS
            left = r.spec.max_new_tokens - len(r.output)
            total += new + len(r.fill) - max(start, full) + max(left, 0)
        self._memo = live  # forget requests no longer waiting
        return total


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
        self._blocks = WaitingBlocks()
        self._holds: dict[str, list[int]] = {}  # rid -> the blocks its submission holds

    @property
    def block_tokens(self) -> int:
        """The hello's `cache_block_tokens`: 0 when publishing nothing."""
        return BLOCK_TOKENS if self.publisher is not None else 0

    def published_blocks(self) -> int:
        """Blocks this replica holds and publishes (the metrics gauge; 0 when publishing none)."""
        return 0 if self.publisher is None else self.publisher.block_count

    def hold(self, r: Request) -> bool:
        """Publish `r`'s prompt blocks while it lives; True if that changed what is published
        (the caller sends `collect_cache` soon)."""
        if self.publisher is None or r.rid in self._holds:
            return False
        hashes = block_hashes(r.cache_keys(len(r.fill)))
        self._holds[r.rid] = hashes
        self._blocks.remember(r, hashes)  # the next load walk need not hash it again
        self.publisher.hold(hashes)
        return bool(hashes)

    def release(self, rid: str) -> None:
        hashes = self._holds.pop(rid, None)
        if hashes and self.publisher is not None:
            self.publisher.release(hashes)

    def collect_cache(self) -> Feed | None:
        """Only the cache changes since the last drain (between steps: new holds)."""
        cache = self.publisher.drain() if self.publisher is not None else None
        return None if cache is None else Feed(cache, None)

    def collect(self, st: SchedState, *, force_load: bool = False) -> Feed | None:
        cache = self.publisher.drain() if self.publisher is not None else None
        load = None
        now = self._clock()
        if force_load or now >= self._next_load:
            t0 = perf_counter()
            current = load_of(st, self._blocks)
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
        return Feed(cache, load_of(st, self._blocks) if st is not None else None)
