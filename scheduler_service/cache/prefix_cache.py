"""The prefix-cache protocol the scheduler is written against, and its factory.

Three implementations share it (chosen with ``--radix``):
- ``tree``  : :class:`~.radix_cache.RadixCache`, RadixAttention (paper sec. 3);
- ``table`` : :class:`~.table_cache.TableCache`, the paper's "no tree structure"
  ablation (whole stored sequences only);
- ``off``   : :class:`~.no_cache.NoCache`, nothing is ever reused.

Slot ownership (the accounting every implementation keeps, checked by ``check_integrity``)::

    allocator.free_count + evictable_size + locked_size + request_owned == capacity

- A slot returned by ``alloc`` belongs to the caller (a request) until it passes the slot to
  ``insert`` (the cache takes it, or frees it as a duplicate) or to ``free_slots``.
- Slots in a ``MatchResult`` belong to the cache; the caller may use them (as a prefix) only
  while it holds ``lock(result.node)``; ``unlock`` when done. The cache never evicts locked slots.
- After ``reset()`` every slot is free and every node handed out before is stale: drop them
  (``unlock`` of a stale node is a no-op; ``lock`` of one raises).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from radixmesh_wire.cache_blocks import HOST_HIT_WEIGHT as _HOST_HIT_WEIGHT

if TYPE_CHECKING:
    from scheduler_service.cache.allocator import SlotAllocator

CACHE_MODES = ("tree", "table", "off")
# A host-tier hit's worth, in GPU-hit tokens, when policies rank matches (docs/radix.md): one
# constant in the wire package, which the front door's router weighs host-resident blocks by.
HOST_HIT_WEIGHT = _HOST_HIT_WEIGHT
EVICTION_POLICIES = ("lru", "lfu")


@dataclass(frozen=True, slots=True)
class MatchResult:
    """A cached prefix: ``slots[i]`` holds the KV of ``tokens[i]``.

    ``node`` is an opaque handle for ``lock``/``unlock``; it is never ``None`` (the cache's root
    when nothing matched) and covers exactly ``slots``. With a host tier (issue 31) the next
    ``host_len`` tokens are cached in host memory only, up to ``host_node``: ``load_host``
    brings them back onto the GPU.
    """

    slots: list[int]
    node: object
    host_len: int = 0
    host_node: object | None = None

    @property
    def length(self) -> int:
        return len(self.slots)


@dataclass(frozen=True, slots=True)
class CachedPrefix:
    """Result of ``cache_unfinished``: the request's slots are unchanged, but now the first
    ``cached_len`` of them belong to the cache, protected by the lock the call took on ``node``
    (which replaces the request's previous lock); the rest still belong to the request (all of
    them for ``off``)."""

    node: object
    cached_len: int


@dataclass(slots=True)
class CacheStats:
    """Counters for reports and metrics (monotonic except on explicit reset by the owner)."""

    evicted_tokens: int = 0
    inserted_tokens: int = 0  # tokens that were new to the cache at insert time
    matched_tokens: int = 0  # sum of match lengths over every match_prefix call
    match_calls: int = 0
    # Wall time spent inside match/insert/evict/lock/unlock/alloc (time.perf_counter).
    bookkeeping_seconds: float = 0.0


class CacheObserver(Protocol):
    """Told about every change of a radix tree's *contents* (not of its locks or LRU times),
    synchronously from inside the tree's operations (``cache_publisher.CachePublisher``
    mirrors them as block hashes). Nodes are the tree's handles; each one's path is fixed
    while it lives (splits add nodes above, never change where a node's path ends)."""

    def added(self, leaf: Any, keys: list[int], start: int) -> None:
        """A new leaf now holds ``keys[start:]`` (``keys``: its whole root path), or a host-only
        node (same edge) is on the GPU again (loaded back, or computed again)."""
        ...

    def split(self, lower: Any, upper: Any, k: int) -> None:
        """``upper`` (new) took the first ``k`` keys of ``lower``'s edge."""
        ...

    def offloaded(self, node: Any) -> None:
        """``node`` lost its GPU slots but stays in the tree, host-only (its KV was saved to the
        host tier, issue 31)."""
        ...

    def evicted(self, node: Any) -> None:
        """A node left the tree, from either tier (its keys are no longer cached)."""
        ...

    def reset(self) -> None:
        """The tree was emptied."""
        ...


def match_limit(n_tokens: int, prefix_limit: int | None) -> int:
    """Longest prefix a request of ``n_tokens`` may take from the cache.

    At least one token is always computed (its logits are sampled), and a request asking for
    prompt logprobs may not be served those positions from the cache (``prefix_limit``).
    """
    limit = n_tokens - 1
    if prefix_limit is not None and prefix_limit < limit:
        limit = prefix_limit
    return limit if limit > 0 else 0


class PrefixCache(Protocol):
    """Token ids -> KV slots, sharing one slot pool with running requests."""

    allocator: SlotAllocator
    stats: CacheStats

    def match_prefix(self, tokens: Sequence[int], max_len: int | None = None) -> MatchResult:
        """Longest cached prefix of ``tokens[:max_len]``; refreshes its LRU time."""
        ...

    def lock(self, node: object) -> None:
        """Protect ``node`` and its ancestors from eviction (evictable -> locked)."""
        ...

    def unlock(self, node: object) -> None:
        """Undo one ``lock``; at zero the sizes move back to evictable."""
        ...

    def insert(self, tokens: Sequence[int], slots: Sequence[int]) -> tuple[int, object]:
        """Cache ``tokens -> slots``, taking ownership of the caller's slots.

        Returns ``(tokens already cached before the call, node covering exactly tokens)``.
        Caller slots duplicating cached tokens are freed by the cache.
        """
        ...

    def cache_unfinished(
        self, tokens: Sequence[int], slots: Sequence[int], old_node: object
    ) -> CachedPrefix | None:
        """Cache the computed tokens of a request that keeps running (after a prefill chunk):
        insert, lock the new node, unlock ``old_node``, so other requests can hit them now.

        Returns ``None`` and changes nothing when the cache already holds some of ``tokens`` in
        other slots (another request computed them concurrently): taking the request's copies
        would change its slots under the model service. The request keeps its slots and
        ``insert`` dedupes them when it finishes.
        """
        ...

    def alloc(self, n: int) -> list[int] | None:
        """``n`` slots, evicting LRU unlocked cache as needed; ``None`` (evicting nothing) if
        free + evictable < n."""
        ...

    def evict(self, n: int) -> int:
        """Free at least ``n`` tokens of unlocked cache if possible; returns tokens freed."""
        ...

    def flush(self) -> int:
        """Drop all unlocked cache (FlushCache), the host tier's too; returns GPU tokens freed."""
        ...

    def free_slots(self, slots: Sequence[int]) -> None:
        """Free request-owned slots that never entered the cache (abort, unused allocations)."""
        ...

    def load_host(self, m: MatchResult) -> MatchResult | None:
        """Bring ``m``'s host-tier part onto the GPU (the caller holds ``lock(m.node)``): the
        whole match in GPU slots with the lock moved to its end, or ``None`` (nothing changed)
        when there is no host part or no room. Only the tree has a host tier."""
        ...

    def loading(self, m: MatchResult) -> bool:
        """Whether ``m``'s GPU part holds slots whose host -> GPU load is queued for the step
        being built: its request may read them only from the next step on (load-ahead)."""
        ...

    def undo_copies(self, step_id: int, readers: Callable[[set[int]], None]) -> int:
        """Step ``step_id`` failed at the model service: drop every cached copy its host-tier
        copies were to write (and what later copies made from them), after
        ``readers(gpu_slots)`` released the running requests whose cached prefix reads such
        GPU slots. Returns the slots freed; 0 without a host tier."""
        ...

    def node_parent(self, node: object) -> object | None:
        """Parent handle of a node (``None`` for the root); used by the dfs-weight policy."""
        ...

    @property
    def evictable_size(self) -> int: ...

    @property
    def locked_size(self) -> int: ...

    @property
    def free_size(self) -> int: ...

    @property
    def protected_size(self) -> int:
        """Evictable tokens that eviction takes only as a last resort (recently inserted: a
        follow-up request is likely on its way). Admission should not count on them while it
        has other work; always 0 for caches without protection."""
        ...

    def total_cached(self) -> int: ...

    def reset(self) -> None:
        """Drop everything: every slot (request-owned ones too) is free again."""
        ...

    def check_integrity(
        self, request_owned: int, request_slots: Sequence[int] | None = None, *, deep: bool = True
    ) -> None:
        """Raise ``AssertionError`` unless the accounting invariant and internal consistency
        hold; ``request_slots`` (optional) lets it also check no slot is held twice.

        ``deep=False`` skips the O(capacity) slot-set checks (free list overlap, duplicates,
        LRU heap) and keeps the accounting sum and the structural checks: cheap enough to run
        after every step with a real-sized pool."""
        ...


def make_prefix_cache(
    mode: str,
    allocator: SlotAllocator,
    *,
    eviction: str = "lru",
    protect_s: float = 0.0,
    observer: CacheObserver | None = None,
    host_capacity: int = 0,
    host_write: str = "write_back",
) -> PrefixCache:
    """Build the cache selected by ``--radix`` (``tree``, ``table`` or ``off``).

    ``eviction`` (``--eviction``) and ``protect_s`` (``--protect-ms``) configure the tree's
    eviction order and insert protection, ``observer`` (``--cache-events``) watches its
    contents; ``table`` and ``off`` ignore all three (they publish no cache events).
    ``host_capacity`` (``--host-kv-tokens``) adds the tree's host-memory tier (issue 31),
    ``host_write`` (``--host-tier-write``) its write policy (``host_tier.WRITE_POLICIES``).
    """
    if eviction not in EVICTION_POLICIES:
        raise ValueError(f"unknown eviction {eviction!r}; expected one of {EVICTION_POLICIES}")
    if host_capacity < 0 or (host_capacity and mode != "tree"):
        raise ValueError(f"a host KV tier ({host_capacity} tokens) needs --radix tree")
    # Imported here: the implementations import MatchResult from this module.
    if mode == "tree":
        from scheduler_service.cache.radix_cache import RadixCache

        return RadixCache(
            allocator,
            eviction=eviction,
            protect_s=protect_s,
            observer=observer,
            host_capacity=host_capacity,
            host_write=host_write,
        )
    if mode == "table":
        from scheduler_service.cache.table_cache import TableCache

        return TableCache(allocator)
    if mode == "off":
        from scheduler_service.cache.no_cache import NoCache

        return NoCache(allocator)
    raise ValueError(f"unknown prefix cache mode {mode!r}; expected one of {CACHE_MODES}")
