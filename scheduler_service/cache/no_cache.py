"""``--radix off``: the "no cache" ablation. Nothing is ever matched; inserted slots are freed.

Every slot is either free or owned by a running request, so the accounting invariant reduces to
``free + request_owned == capacity``. ``cache_unfinished`` leaves a chunked request owning all of
its slots (``cached_len == 0``), which is what keeps chunked prefill working with no cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter

from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.prefix_cache import CachedPrefix, CacheStats, MatchResult


class _Root:
    """The only handle this cache ever hands out."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NoCache.root"


class NoCache:
    """Prefix cache that caches nothing (``PrefixCache`` protocol)."""

    def __init__(self, allocator: SlotAllocator) -> None:
        self.allocator = allocator
        self.stats = CacheStats()
        self._root = _Root()

    @property
    def root(self) -> object:
        return self._root

    @property
    def evictable_size(self) -> int:
        return 0

    @property
    def locked_size(self) -> int:
        return 0

    @property
    def free_size(self) -> int:
        return self.allocator.free_count

    @property
    def protected_size(self) -> int:
        return 0  # no insert protection

    def total_cached(self) -> int:
        return 0

    def match_prefix(self, tokens: Sequence[int], max_len: int | None = None) -> MatchResult:
        self.stats.match_calls += 1
        return MatchResult([], self._root)

    def lock(self, node: object) -> None:
        pass

    def unlock(self, node: object) -> None:
        pass

    def insert(self, tokens: Sequence[int], slots: Sequence[int]) -> tuple[int, object]:
        t0 = perf_counter()
        if len(tokens) != len(slots):
            raise ValueError(f"insert: {len(tokens)} tokens but {len(slots)} slots")
        # No slot of ours can be in `slots` (we never hand any out), so all are the caller's.
        self.allocator.free(slots)
        self.stats.bookkeeping_seconds += perf_counter() - t0
        return 0, self._root

    def cache_unfinished(
        self, tokens: Sequence[int], slots: Sequence[int], old_node: object
    ) -> CachedPrefix | None:
        # Keep everything with the request: freeing here would pull KV from under it.
        return CachedPrefix(self._root, 0)

    def alloc(self, n: int) -> list[int] | None:
        return self.allocator.alloc(n)

    def evict(self, n: int) -> int:
        return 0

    def free_slots(self, slots: Sequence[int]) -> None:
        self.allocator.free(slots)

    def load_host(self, m: MatchResult) -> MatchResult | None:
        return None  # no host tier: only the tree has one

    def loading(self, m: MatchResult) -> bool:
        return False

    def undo_copies(self, step_id: int, readers: Callable[[set[int]], None]) -> int:
        return 0  # no host tier: no copies

    def flush(self) -> int:
        return self.evict(self.evictable_size)

    def node_parent(self, node: object) -> object | None:
        return None

    def reset(self) -> None:
        self.allocator.reset()

    def check_integrity(
        self, request_owned: int, request_slots: Sequence[int] | None = None, *, deep: bool = True
    ) -> None:
        alloc = self.allocator
        if not deep:
            if alloc.free_count + request_owned != alloc.capacity:
                raise AssertionError(
                    f"no cache integrity: free {alloc.free_count} + request_owned "
                    f"{request_owned} != capacity {alloc.capacity}"
                )
            return
        free = alloc.free_list()
        free_set = set(free)
        if len(free_set) != len(free):
            raise AssertionError("no cache integrity: allocator free list holds a slot twice")
        if request_slots is not None:
            req = set(request_slots)
            if len(req) != len(request_slots) or len(req) != request_owned or req & free_set:
                raise AssertionError("no cache integrity: request slots repeat or are free")
        if len(free) + request_owned != alloc.capacity:
            raise AssertionError(
                f"no cache integrity: free {len(free)} + request_owned {request_owned} "
                f"!= capacity {alloc.capacity}"
            )
