"""The paper's "no tree structure" ablation: a flat table of whole previously inserted sequences.

Matching: a query hits an entry only when the entry's *whole* sequence is a prefix of it (the
longest such entry wins). The table never discovers a common prefix of two different sequences,
so ``[P, q1]`` cached does not help ``[P, q2]``: that request recomputes ``P`` into fresh slots
and its entry stores a second copy. Eviction is LRU over whole unlocked entries.

Slot sharing: there is no KV copy in the step protocol, so when a request reuses entry ``E``'s
slots as its prefix and later inserts its longer sequence, the new entry necessarily holds
``E``'s slots too. Slots therefore carry a reference count (how many entries hold them) and
return to the allocator when the last entry holding them is evicted. This is sharing the table
*inherited* from a reuse, never sharing it found by itself; duplicates of independently computed
prefixes still cost slots, which is the point of the ablation.

Invariants (checked by ``check_integrity``):
- ``ref[s]`` == number of live entries whose ``slots`` contain ``s``; ``s`` is free iff
  ``ref[s] == 0`` and no request owns it;
- ``lockcnt[s]`` == number of live entries with ``lock_ref > 0`` containing ``s``;
- ``locked_size`` == #slots with ``ref > 0 and lockcnt > 0``; ``evictable_size`` == #slots with
  ``ref > 0 and lockcnt == 0`` (every such slot is freed by evicting all unlocked entries);
- ``free + evictable + locked + request_owned == capacity``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from time import perf_counter

from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.prefix_cache import CachedPrefix, CacheStats, MatchResult


class _Entry:
    __slots__ = ("key", "slots", "lock_ref", "last_access", "dead")

    def __init__(self, key: tuple[int, ...], slots: list[int], now: int) -> None:
        self.key = key
        self.slots = slots
        self.lock_ref = 0
        self.last_access = now
        self.dead = False

    def __repr__(self) -> str:
        return f"_Entry(len={len(self.key)}, key={list(self.key[:4])}, lock={self.lock_ref})"


class TableCache:
    """Flat exact-sequence cache implementing the ``PrefixCache`` protocol."""

    def __init__(self, allocator: SlotAllocator) -> None:
        self.allocator = allocator
        self.stats = CacheStats()
        cap = allocator.capacity
        self._ref = [0] * cap
        self._lockcnt = [0] * cap
        self._entries: dict[tuple[int, ...], _Entry] = {}
        self._length_count: dict[int, int] = {}  # entry length -> number of entries
        self._lengths_desc: list[int] = []  # distinct lengths, longest first
        self._root = _Entry((), [], 0)  # the "nothing matched" handle
        self._clock = 0
        self._seq = itertools.count()
        self._heap: list[tuple[int, int, _Entry]] = []
        self._evictable = 0
        self._locked = 0

    # -- sizes --------------------------------------------------------------------------------
    @property
    def evictable_size(self) -> int:
        return self._evictable

    @property
    def locked_size(self) -> int:
        return self._locked

    @property
    def free_size(self) -> int:
        return self.allocator.free_count

    @property
    def protected_size(self) -> int:
        return 0  # no insert protection

    def total_cached(self) -> int:
        return self._evictable + self._locked

    @property
    def root(self) -> object:
        return self._root

    # -- match --------------------------------------------------------------------------------
    def _longest_entry(self, toks: Sequence[int], limit: int) -> _Entry | None:
        # One dict probe per distinct entry length: O(#lengths x length) per query, which is
        # fine for an ablation (the tree is the production path).
        entries = self._entries
        for length in self._lengths_desc:
            if length > limit:
                continue
            e = entries.get(tuple(toks[:length]))
            if e is not None:
                return e
        return None

    def match_prefix(self, tokens: Sequence[int], max_len: int | None = None) -> MatchResult:
        t0 = perf_counter()
        limit = len(tokens) if max_len is None else max(0, min(max_len, len(tokens)))
        e = self._longest_entry(tokens, limit) if limit else None
        self._clock += 1
        st = self.stats
        st.match_calls += 1
        if e is None:
            st.bookkeeping_seconds += perf_counter() - t0
            return MatchResult([], self._root)
        self._touch(e)
        st.matched_tokens += len(e.slots)
        st.bookkeeping_seconds += perf_counter() - t0
        return MatchResult(list(e.slots), e)

    def _touch(self, e: _Entry) -> None:
        e.last_access = self._clock
        if e.lock_ref == 0:
            self._push(e)

    # -- lock ---------------------------------------------------------------------------------
    def _entry(self, node: object) -> _Entry:
        if not isinstance(node, _Entry):
            raise TypeError(f"not a table cache entry: {node!r}")
        return node

    def lock(self, node: object) -> None:
        t0 = perf_counter()
        e = self._entry(node)
        if e is not self._root:
            if e.dead:
                raise ValueError(f"lock of a stale entry (evicted or reset): {e!r}")
            e.lock_ref += 1
            if e.lock_ref == 1:
                lc, moved = self._lockcnt, 0
                for s in e.slots:
                    lc[s] += 1
                    if lc[s] == 1:
                        moved += 1
                self._evictable -= moved
                self._locked += moved
        self.stats.bookkeeping_seconds += perf_counter() - t0

    def unlock(self, node: object) -> None:
        t0 = perf_counter()
        e = self._entry(node)
        if e is not self._root and not e.dead:  # dead + locked only after reset(): ignore
            if e.lock_ref <= 0:
                raise ValueError(f"unlock without a matching lock: {e!r}")
            e.lock_ref -= 1
            if e.lock_ref == 0:
                lc, moved = self._lockcnt, 0
                for s in e.slots:
                    lc[s] -= 1
                    if lc[s] == 0:
                        moved += 1
                self._evictable += moved
                self._locked -= moved
                self._push(e)
        self.stats.bookkeeping_seconds += perf_counter() - t0

    # -- insert -------------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], slots: Sequence[int]) -> tuple[int, object]:
        t0 = perf_counter()
        if len(tokens) != len(slots):
            raise ValueError(f"insert: {len(tokens)} tokens but {len(slots)} slots")
        key = tuple(tokens)
        if not key:
            return 0, self._root
        sl = list(slots)
        self._clock += 1
        ref = self._ref
        existing = self._entries.get(key)
        if existing is not None:
            # Same sequence already stored: keep its slots, free the caller's own copies (a
            # caller slot with ref > 0 is a cache slot it borrowed through a match, not a copy).
            dup = [s for s, c in zip(sl, existing.slots, strict=True) if s != c and ref[s] == 0]
            self.allocator.free(dup)
            self._touch(existing)
            self.stats.bookkeeping_seconds += perf_counter() - t0
            return len(key), existing
        prior = self._longest_entry(key, len(key))
        cached = len(prior.slots) if prior is not None else 0
        e = _Entry(key, sl, self._clock)
        self._entries[key] = e
        self._add_length(len(key))
        new = 0
        for s in sl:
            if ref[s] == 0:
                new += 1  # a caller-owned slot enters the cache
            ref[s] += 1
        # A shared slot (ref was > 0) is already counted as evictable or locked.
        self._evictable += new
        self.stats.inserted_tokens += new
        self._push(e)
        self.stats.bookkeeping_seconds += perf_counter() - t0
        return cached, e

    def _add_length(self, length: int) -> None:
        c = self._length_count.get(length, 0)
        self._length_count[length] = c + 1
        if c == 0:
            self._lengths_desc = sorted(self._length_count, reverse=True)

    def _drop_length(self, length: int) -> None:
        c = self._length_count[length] - 1
        if c:
            self._length_count[length] = c
        else:
            del self._length_count[length]
            self._lengths_desc = sorted(self._length_count, reverse=True)

    def cache_unfinished(
        self, tokens: Sequence[int], slots: Sequence[int], old_node: object
    ) -> CachedPrefix | None:
        """Insert a running request's computed tokens and move its lock to the new entry
        (``None``, nothing changed, if the same sequence is stored with other slots)."""
        existing = self._entries.get(tuple(tokens))
        if existing is not None and existing.slots != list(slots):
            return None
        _, node = self.insert(tokens, slots)
        self.lock(node)
        self.unlock(old_node)
        return CachedPrefix(node, len(tokens))

    # -- evict / alloc ------------------------------------------------------------------------
    def _push(self, e: _Entry) -> None:
        heap = self._heap
        heapq.heappush(heap, (e.last_access, next(self._seq), e))
        if len(heap) > 2 * len(self._entries) + 256:
            heap = [
                (x.last_access, next(self._seq), x)
                for x in self._entries.values()
                if x.lock_ref == 0
            ]
            heapq.heapify(heap)
            self._heap = heap

    def _evict(self, n: int) -> int:
        freed = 0
        heap = self._heap
        ref = self._ref
        while freed < n and heap:
            t, _, e = heapq.heappop(heap)
            if e.dead or e.lock_ref or e.last_access != t:
                continue
            e.dead = True
            del self._entries[e.key]
            self._drop_length(len(e.key))
            gone = []
            for s in e.slots:
                ref[s] -= 1
                if ref[s] == 0:
                    gone.append(s)
            # Slots still held by another entry stay cached (and counted) there.
            self.allocator.free(gone)
            freed += len(gone)
            self._evictable -= len(gone)
        self.stats.evicted_tokens += freed
        return freed

    def evict(self, n: int) -> int:
        t0 = perf_counter()
        freed = self._evict(n) if n > 0 else 0
        self.stats.bookkeeping_seconds += perf_counter() - t0
        return freed

    def alloc(self, n: int) -> list[int] | None:
        t0 = perf_counter()
        free = self.allocator.free_count
        out: list[int] | None
        if n > free + self._evictable:
            out = None
        else:
            if n > free:
                self._evict(n - free)
            out = self.allocator.alloc(n)
        self.stats.bookkeeping_seconds += perf_counter() - t0
        return out

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
        # Flat: every entry hangs off the root.
        return None if self._entry(node) is self._root else self._root

    # -- reset / introspection ----------------------------------------------------------------
    def reset(self) -> None:
        for e in self._entries.values():
            e.dead = True
        cap = self.allocator.capacity
        self._ref = [0] * cap
        self._lockcnt = [0] * cap
        self._entries = {}
        self._length_count = {}
        self._lengths_desc = []
        self._heap = []
        self._evictable = 0
        self._locked = 0
        self.allocator.reset()

    def entries(self) -> dict[tuple[int, ...], list[int]]:
        """Stored sequences -> slots (tests and debugging)."""
        return {k: list(e.slots) for k, e in self._entries.items()}

    def check_integrity(
        self, request_owned: int, request_slots: Sequence[int] | None = None, *, deep: bool = True
    ) -> None:
        def fail(msg: str) -> None:
            raise AssertionError(f"table cache integrity: {msg}")

        cap = self.allocator.capacity
        if not deep:
            free_n = self.allocator.free_count
            if free_n + self._evictable + self._locked + request_owned != cap:
                fail(
                    f"free {free_n} + evictable {self._evictable} + locked {self._locked} + "
                    f"request_owned {request_owned} != capacity {cap}"
                )
            return
        ref = [0] * cap
        lockcnt = [0] * cap
        for key, e in self._entries.items():
            if e.dead or e.key != key or len(e.slots) != len(key) or not key:
                fail(f"bad entry {e!r}")
            if e.lock_ref < 0:
                fail(f"negative lock count at {e!r}")
            if len(set(e.slots)) != len(e.slots):
                fail(f"entry {e!r} holds a slot twice")
            for s in e.slots:
                if not 0 <= s < cap:
                    fail(f"slot {s} out of range")
                ref[s] += 1
                if e.lock_ref:
                    lockcnt[s] += 1
        if ref != self._ref:
            fail("slot reference counts drifted from the entries")
        if lockcnt != self._lockcnt:
            fail("slot lock counts drifted from the entries")
        held = {s for s in range(cap) if ref[s]}
        locked = sum(1 for s in held if lockcnt[s])
        evictable = len(held) - locked
        if evictable != self._evictable or locked != self._locked:
            fail(
                f"sizes say evictable={self._evictable} locked={self._locked}, entries give "
                f"evictable={evictable} locked={locked}"
            )
        free = self.allocator.free_list()
        free_set = set(free)
        if len(free_set) != len(free):
            fail("allocator free list holds a slot twice")
        if held & free_set:
            fail(f"slots both cached and free: {sorted(held & free_set)[:10]}")
        if request_slots is not None:
            req = set(request_slots)
            if len(req) != len(request_slots) or len(req) != request_owned:
                fail("request slots repeat or do not add up to request_owned")
            if req & (held | free_set):
                fail("a request-owned slot is also cached or free")
        total = len(free) + evictable + locked + request_owned
        if total != cap:
            fail(
                f"free {len(free)} + evictable {evictable} + locked {locked} + request_owned "
                f"{request_owned} = {total} != capacity {cap}"
            )
        valid = {
            id(e) for t, _, e in self._heap if not e.dead and not e.lock_ref and e.last_access == t
        }
        if any(e.lock_ref == 0 and id(e) not in valid for e in self._entries.values()):
            fail("an unlocked entry is missing from the LRU heap")
