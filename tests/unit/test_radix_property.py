"""Stateful property tests: the prefix caches against naive reference models.

RadixCache model: a dict ``prefix tuple -> KV slot of its last token`` (the set of cached
prefixes is closed under taking prefixes). It is updated by our own reasoning on insert, and on
evictions by observation: a cached slot that the allocator got back (free, or handed out again
by the same ``alloc``) was evicted. After every step the tree must equal the model exactly, so
matches return the longest cached prefix, insert reports what was cached, locked prefixes keep
their slots, and ``check_integrity`` holds with the request-owned slots we track.

TableCache model: the set of stored sequences -> slots; entries may only disappear through
eviction (never while locked) and never change.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.radix_cache import RadixCache
from scheduler_service.cache.table_cache import TableCache

CAPACITY = 24
TOKENS = st.lists(st.integers(0, 2), min_size=0, max_size=9)  # small alphabet: lots of sharing
NONEMPTY = st.lists(st.integers(0, 2), min_size=1, max_size=9)
LIMITS = st.none() | st.integers(0, 9)
SETTINGS = settings(
    max_examples=200,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TABLE_SETTINGS = settings(SETTINGS, max_examples=100)  # the ablation: a lighter check

Prefix = tuple[int, ...]


class InFlight:
    """A running request mid-prefill: ``slots[:cached]`` are the cache's (locked via ``node``),
    the rest are its own."""

    def __init__(self, toks: list[int], slots: list[int], node: object, cached: int) -> None:
        self.toks, self.slots, self.node, self.cached = toks, slots, node, cached


class RadixMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = SlotAllocator(CAPACITY, debug=True)
        self.cache = self.make_cache(self.alloc)
        self.model: dict[Prefix, int] = {}
        self.owned: list[list[int]] = []  # request-owned slot chunks
        self.locks: list[tuple[object, Prefix, list[int]]] = []  # node, tokens, slots
        self.running: list[InFlight] = []

    def make_cache(self, alloc: SlotAllocator) -> RadixCache:
        return RadixCache(alloc)

    # -- reference model ----------------------------------------------------------------------
    def longest(self, toks: list[int], limit: int | None) -> int:
        n = len(toks) if limit is None else min(limit, len(toks))
        i = 0
        while i < n and tuple(toks[: i + 1]) in self.model:
            i += 1
        return i

    def observe_evictions(self, handed_out: list[int] | None = None) -> int:
        """Drop model prefixes whose slot came back to the allocator; return how many."""
        back = set(self.alloc.free_list()) | set(handed_out or ())
        gone = {p for p, s in self.model.items() if s in back}
        for p in gone:
            del self.model[p]
        for p in self.model:  # leaves first: no cached prefix lost an ancestor
            assert all(p[:i] in self.model for i in range(1, len(p))), p
        return len(gone)

    # -- rules --------------------------------------------------------------------------------
    @rule(toks=TOKENS, limit=LIMITS)
    def match(self, toks: list[int], limit: int | None) -> None:
        m = self.cache.match_prefix(toks, limit)
        want = self.longest(toks, limit)
        assert m.length == want
        assert m.slots == [self.model[tuple(toks[: i + 1])] for i in range(want)]
        assert m.node is not None

    @rule(toks=TOKENS, limit=LIMITS)
    def lock(self, toks: list[int], limit: int | None) -> None:
        m = self.cache.match_prefix(toks, limit)
        self.cache.lock(m.node)
        self.locks.append((m.node, tuple(toks[: m.length]), m.slots))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 1000))
    def unlock(self, i: int) -> None:
        node, _, _ = self.locks.pop(i % len(self.locks))
        self.cache.unlock(node)

    @rule(n=st.integers(0, CAPACITY))
    def alloc_slots(self, n: int) -> None:
        avail = self.cache.free_size + self.cache.evictable_size
        cached = self.cache.total_cached()
        got = self.cache.alloc(n)
        if got is None:
            assert n > avail
            assert self.cache.total_cached() == cached  # nothing evicted in vain
            return
        assert len(got) == n == len(set(got))
        self.observe_evictions(got)
        self.owned.append(got)

    @precondition(lambda self: self.owned)
    @rule(i=st.integers(0, 1000))
    def free_owned(self, i: int) -> None:
        self.cache.free_slots(self.owned.pop(i % len(self.owned)))

    @rule(n=st.integers(1, CAPACITY))
    def evict(self, n: int) -> None:
        evictable = self.cache.evictable_size
        freed = self.cache.evict(n)
        assert freed == self.observe_evictions()
        assert freed >= min(n, evictable)
        assert freed <= evictable

    @rule(toks=NONEMPTY, reuse=st.booleans())
    def request(self, toks: list[int], reuse: bool) -> None:
        """A request computes ``toks``: reusing its cached prefix (locked meanwhile) or
        recomputing everything into fresh slots, then inserts the result."""
        if reuse:
            m = self.cache.match_prefix(toks)
            self.cache.lock(m.node)
            prefix, node = m.slots, m.node
        else:
            prefix, node = [], None
        got = self.cache.alloc(len(toks) - len(prefix))
        if got is not None:
            self.observe_evictions(got)
            slots = prefix + got
            want = self.longest(toks, None)
            cached, inserted = self.cache.insert(toks, slots)
            assert cached == want
            for i, s in enumerate(slots):
                p = tuple(toks[: i + 1])
                if p not in self.model:
                    self.model[p] = s
                elif self.model[p] != s:
                    assert self.alloc.is_free(s)  # our duplicate copy went back
            assert self.cache.match_prefix(toks).node is inserted  # covers exactly toks
        if node is not None:
            self.cache.unlock(node)

    def add_to_model(self, toks: list[int], slots: list[int]) -> None:
        for i, s in enumerate(slots):
            p = tuple(toks[: i + 1])
            if p not in self.model:
                self.model[p] = s
            elif self.model[p] != s:
                assert self.alloc.is_free(s)  # a duplicate copy went back

    @rule(toks=NONEMPTY, first=st.integers(1, 9))
    def start(self, toks: list[int], first: int) -> None:
        m = self.cache.match_prefix(toks, len(toks) - 1)
        self.cache.lock(m.node)
        got = self.cache.alloc(min(first, len(toks) - m.length))
        if got is None:
            self.cache.unlock(m.node)
            return
        self.observe_evictions(got)
        self.running.append(InFlight(toks, m.slots + got, m.node, m.length))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 1000), n=st.integers(1, 9))
    def next_chunk(self, i: int, n: int) -> None:
        r = self.running[i % len(self.running)]
        got = self.cache.alloc(min(n, len(r.toks) - len(r.slots)))
        if got is not None:
            self.observe_evictions(got)
            r.slots += got

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 1000))
    def cache_chunk(self, i: int) -> None:
        r = self.running[i % len(self.running)]
        kv = len(r.slots)
        clash = any(
            self.model.get(tuple(r.toks[: j + 1]), r.slots[j]) != r.slots[j] for j in range(kv)
        )
        free = self.cache.free_size
        res = self.cache.cache_unfinished(r.toks[:kv], r.slots, r.node)
        if clash:
            assert res is None and self.cache.free_size == free
            return
        assert res is not None and res.cached_len == kv
        self.add_to_model(r.toks[:kv], r.slots)
        r.node, r.cached = res.node, kv

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 1000))
    def finish(self, i: int) -> None:
        r = self.running.pop(i % len(self.running))
        kv = len(r.slots)
        cached, _ = self.cache.insert(r.toks[:kv], r.slots)
        assert cached == self.longest(r.toks[:kv], None)
        self.add_to_model(r.toks[:kv], r.slots)
        self.cache.unlock(r.node)

    @rule()
    def reset(self) -> None:
        self.cache.reset()
        self.model.clear()
        self.owned.clear()
        self.locks.clear()
        self.running.clear()

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        owned = [s for chunk in self.owned for s in chunk]
        owned += [s for r in self.running for s in r.slots[r.cached :]]
        self.cache.check_integrity(len(owned), owned)
        assert self.cache.debug_prefix_map() == self.model
        for _, toks, slots in self.locks:  # locked prefixes were never evicted
            assert [self.model[toks[: i + 1]] for i in range(len(toks))] == slots
        for r in self.running:
            assert [self.model[tuple(r.toks[: i + 1])] for i in range(r.cached)] == r.slots[
                : r.cached
            ]
        assert self.cache.total_cached() == len(self.model)


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = SETTINGS


class LfuProtectMachine(RadixMachine):
    """The same model and rules with LFU eviction order and insert protection on a fake clock
    that a rule advances: neither may change what is cached, only which leaf goes first, so
    every model check still holds; protected tokens are always evictable tokens."""

    def make_cache(self, alloc: SlotAllocator) -> RadixCache:
        self.now = 0.0
        return RadixCache(alloc, eviction="lfu", protect_s=1.0, clock=lambda: self.now)

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0]))
    def advance_clock(self, dt: float) -> None:
        self.now += dt

    @invariant()
    def protected_is_evictable(self) -> None:
        assert 0 <= self.cache.protected_size <= self.cache.evictable_size


TestLfuProtectMachine = LfuProtectMachine.TestCase
TestLfuProtectMachine.settings = SETTINGS


class TableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = SlotAllocator(CAPACITY, debug=True)
        self.cache = TableCache(self.alloc)
        self.model: dict[Prefix, list[int]] = {}
        self.owned: list[list[int]] = []
        self.locks: list[tuple[object, Prefix]] = []

    def observe(self) -> None:
        now = self.cache.entries()
        locked = {k for _, k in self.locks}
        for k, v in self.model.items():
            if k in now:
                assert now[k] == v  # entries never change
            else:
                assert k not in locked  # only unlocked entries are evicted
        self.model = {k: v for k, v in self.model.items() if k in now}

    def longest(self, toks: list[int], limit: int | None) -> int:
        n = len(toks) if limit is None else min(limit, len(toks))
        return max(
            (len(k) for k in self.model if len(k) <= n and tuple(toks[: len(k)]) == k), default=0
        )

    @rule(toks=TOKENS, limit=LIMITS, keep_lock=st.booleans())
    def match(self, toks: list[int], limit: int | None, keep_lock: bool) -> None:
        m = self.cache.match_prefix(toks, limit)
        assert m.length == self.longest(toks, limit)
        if m.length:
            assert m.slots == self.model[tuple(toks[: m.length])]
        if keep_lock:
            self.cache.lock(m.node)
            self.locks.append((m.node, tuple(toks[: m.length])))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 1000))
    def unlock(self, i: int) -> None:
        node, _ = self.locks.pop(i % len(self.locks))
        self.cache.unlock(node)

    @rule(toks=NONEMPTY, reuse=st.booleans())
    def request(self, toks: list[int], reuse: bool) -> None:
        m = self.cache.match_prefix(toks) if reuse else None
        if m is not None:
            self.cache.lock(m.node)
        prefix = m.slots if m is not None else []
        got = self.cache.alloc(len(toks) - len(prefix))
        self.observe()
        if got is not None:
            self.cache.insert(toks, prefix + got)
            key = tuple(toks)
            self.model.setdefault(key, prefix + got)
            assert self.cache.entries()[key] == self.model[key]
        if m is not None:
            self.cache.unlock(m.node)

    @rule(n=st.integers(0, CAPACITY))
    def alloc_slots(self, n: int) -> None:
        got = self.cache.alloc(n)
        self.observe()
        if got is not None:
            self.owned.append(got)

    @precondition(lambda self: self.owned)
    @rule(i=st.integers(0, 1000))
    def free_owned(self, i: int) -> None:
        self.cache.free_slots(self.owned.pop(i % len(self.owned)))

    @rule(n=st.integers(1, CAPACITY))
    def evict(self, n: int) -> None:
        evictable = self.cache.evictable_size
        freed = self.cache.evict(n)
        self.observe()
        assert min(n, evictable) <= freed <= evictable

    @invariant()
    def consistent(self) -> None:
        owned = [s for chunk in self.owned for s in chunk]
        self.cache.check_integrity(len(owned), owned)
        assert self.cache.entries() == self.model


TestTableMachine = TableMachine.TestCase
TestTableMachine.settings = TABLE_SETTINGS
