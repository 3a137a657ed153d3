"""Unit tests: slot allocator, radix tree cache, table ablation, no-cache, factory."""

from __future__ import annotations

import pytest

from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.no_cache import NoCache
from scheduler_service.cache.prefix_cache import PrefixCache, make_prefix_cache, match_limit
from scheduler_service.cache.radix_cache import RadixCache
from scheduler_service.cache.radix_node import intern_tokens
from scheduler_service.cache.table_cache import TableCache


def tree(capacity: int = 32) -> RadixCache:
    return RadixCache(SlotAllocator(capacity, debug=True))


def put(cache: PrefixCache, tokens: list[int]) -> list[int]:
    """Compute ``tokens`` the way a request does (reuse the cached prefix) and cache them."""
    m = cache.match_prefix(tokens)
    cache.lock(m.node)
    new = cache.alloc(len(tokens) - m.length)
    assert new is not None
    slots = m.slots + new
    cache.insert(tokens, slots)
    cache.unlock(m.node)
    return slots


# -- allocator ------------------------------------------------------------------------------
def test_allocator_all_or_nothing_and_double_free() -> None:
    a = SlotAllocator(4, debug=True)
    assert a.alloc(3) == [0, 1, 2]
    assert a.alloc(2) is None and a.free_count == 1  # never partial
    assert a.alloc(0) == []
    a.free([1])
    with pytest.raises(ValueError, match="double free"):
        a.free([1])
    with pytest.raises(ValueError, match="out of range"):
        a.free([4])
    with pytest.raises(ValueError, match="double free"):
        a.free([0, 0])
    with pytest.raises(ValueError):
        a.alloc(-1)
    a.reset()
    assert a.free_count == 4 and sorted(a.free_list()) == [0, 1, 2, 3]


def test_allocator_drain_freed() -> None:
    a = SlotAllocator(4, track_freed=True)
    s = a.alloc(3)
    assert s is not None
    a.free(s[:2])
    a.free(iter([s[2]]))
    assert a.drain_freed() == s
    assert a.drain_freed() == []
    quiet = SlotAllocator(2)
    quiet.free(quiet.alloc(2) or [])
    assert quiet.drain_freed() == []


# -- match / split --------------------------------------------------------------------------
def test_match_splits_mid_edge_and_node_covers_exactly_the_match() -> None:
    c = tree()
    slots = put(c, [1, 2, 3, 4, 5, 6])
    m = c.match_prefix([1, 2, 3, 9, 9])
    assert m.length == 3 and m.slots == slots[:3]
    c.lock(m.node)  # protects exactly the 3 matched tokens
    assert c.locked_size == 3 and c.evictable_size == 3
    assert c.evict(100) == 3  # the [4, 5, 6] tail goes, the locked head stays
    assert c.match_prefix([1, 2, 3, 4]).length == 3
    c.unlock(m.node)
    c.check_integrity(0)
    assert c.debug_prefix_map() == {(1,): slots[0], (1, 2): slots[1], (1, 2, 3): slots[2]}


def test_match_respects_max_len_and_tuple_input() -> None:
    c = tree()
    slots = put(c, [1, 2, 3, 4])
    assert c.match_prefix((1, 2, 3, 4)).slots == slots  # any Sequence works
    m = c.match_prefix([1, 2, 3, 4], max_len=2)
    assert m.slots == slots[:2]
    assert c.match_prefix([1, 2, 3, 4], max_len=0).length == 0
    assert c.match_prefix([]).node is c.root
    nothing = c.match_prefix([7])
    assert nothing.length == 0 and nothing.node is c.root
    c.lock(nothing.node)  # locking the root is a harmless no-op
    c.unlock(nothing.node)
    assert match_limit(5, None) == 4 and match_limit(5, 2) == 2 and match_limit(1, None) == 0
    c.check_integrity(0)


def test_long_edges_compare_correctly() -> None:
    c = tree(5000)
    base = list(range(2000))
    put(c, base)
    for cut in (0, 1, 17, 999, 1998):
        q = base[:cut] + [-1] + base[cut + 1 :]
        assert c.match_prefix(q).length == cut
    c.check_integrity(0)


# -- insert ---------------------------------------------------------------------------------
def test_insert_frees_duplicate_slots_and_reports_cached_length() -> None:
    c = tree(16)
    first = put(c, [1, 2, 3, 4])
    mine = c.alloc(6)
    assert mine is not None
    free_before = c.free_size
    cached, node = c.insert([1, 2, 3, 4, 5, 6], mine)
    assert cached == 4
    assert c.free_size == free_before + 4  # my copies of the 4 cached tokens came back
    assert c.match_prefix([1, 2, 3, 4, 5, 6]).slots == first + mine[4:]
    assert c.total_cached() == 6
    c.check_integrity(0)


def test_insert_keeps_callers_shared_prefix_slots() -> None:
    c = tree(16)
    m_slots = put(c, [1, 2, 3])
    m = c.match_prefix([1, 2, 3, 4])
    c.lock(m.node)
    new = c.alloc(2)
    assert new is not None
    free_before = c.free_size
    cached, node = c.insert([1, 2, 3, 4, 5], m.slots + new)
    assert cached == 3 and c.free_size == free_before  # nothing duplicated
    c.unlock(m.node)
    assert c.match_prefix([1, 2, 3, 4, 5, 6]).slots == m_slots + new
    c.check_integrity(0)


def test_insert_of_a_prefix_splits_and_returns_exact_node() -> None:
    c = tree(16)
    slots = put(c, [1, 2, 3, 4, 5])
    cached, node = c.insert([1, 2], slots[:2])
    assert cached == 2
    c.lock(node)
    assert c.locked_size == 2
    assert c.evict(100) == 3
    c.unlock(node)
    assert c.insert([], []) == (0, c.root)
    with pytest.raises(ValueError):
        c.insert([1], [])
    c.check_integrity(0)


def test_cache_unfinished_moves_the_lock() -> None:
    c = tree(32)
    put(c, [1, 2, 3, 4])
    m = c.match_prefix([1, 2, 9])  # our request matched [1, 2]
    c.lock(m.node)
    chunk = c.alloc(3)
    assert chunk is not None
    res = c.cache_unfinished([1, 2, 7, 8, 9], m.slots + chunk, m.node)
    assert res is not None and res.cached_len == 5
    assert c.locked_size == 5 and c.evictable_size == 2  # [3, 4] is the only unlocked tail
    assert c.match_prefix([1, 2, 7, 8, 9, 0]).slots == m.slots + chunk  # others can hit it
    c.check_integrity(0)
    more = c.alloc(2)  # the next chunk
    assert more is not None
    res2 = c.cache_unfinished([1, 2, 7, 8, 9, 5, 6], m.slots + chunk + more, res.node)
    assert res2 is not None and res2.cached_len == 7 and c.locked_size == 7
    c.unlock(res2.node)
    assert c.locked_size == 0
    c.check_integrity(0)


def test_cache_unfinished_declines_when_tokens_are_cached_elsewhere() -> None:
    c = tree(32)
    m = c.match_prefix([1, 2, 3, 4, 5, 6])
    mine = c.alloc(6)  # our request started prefilling [1..6]...
    assert mine is not None
    put(c, [1, 2, 3, 4])  # ...while another request cached [1..4] in its own slots
    free = c.free_size
    assert c.cache_unfinished([1, 2, 3, 4, 5, 6], mine, m.node) is None
    assert c.free_size == free and c.locked_size == 0  # nothing changed: our slots stay ours
    c.check_integrity(6, mine)
    assert c.insert([1, 2, 3, 4, 5, 6], mine)[0] == 4  # at finish: our 4 copies are freed
    c.check_integrity(0)


# -- lock / unlock --------------------------------------------------------------------------
def test_lock_moves_sizes_along_the_path() -> None:
    c = tree(32)
    put(c, [1, 2, 3, 4])
    put(c, [1, 2, 7, 8, 9])
    assert (c.evictable_size, c.locked_size) == (7, 0)
    deep = c.match_prefix([1, 2, 7, 8, 9]).node
    c.lock(deep)
    assert (c.evictable_size, c.locked_size) == (2, 5)  # [1,2] shared head + [7,8,9]
    c.lock(deep)
    other = c.match_prefix([1, 2, 3, 4]).node
    c.lock(other)
    assert (c.evictable_size, c.locked_size) == (0, 7)
    c.unlock(deep)
    c.unlock(deep)
    assert (c.evictable_size, c.locked_size) == (3, 4)
    c.unlock(other)
    assert (c.evictable_size, c.locked_size) == (7, 0)
    with pytest.raises(ValueError, match="without a matching lock"):
        c.unlock(other)
    with pytest.raises(TypeError):
        c.lock(object())
    c.check_integrity(0)


def test_locked_nodes_are_never_evicted_and_alloc_fails_cleanly() -> None:
    c = tree(10)
    put(c, [1, 2, 3, 4, 5, 6])
    node = c.match_prefix([1, 2, 3, 4, 5, 6]).node
    c.lock(node)
    assert c.evict(10) == 0
    assert c.alloc(5) is None  # 4 free + 0 evictable
    assert c.total_cached() == 6 and c.free_size == 4  # nothing was evicted trying
    got = c.alloc(4)
    assert got is not None and len(got) == 4
    c.free_slots(got)
    c.unlock(node)
    got = c.alloc(10)
    assert got is not None and c.total_cached() == 0
    c.check_integrity(10)


def test_lock_of_evicted_node_raises() -> None:
    c = tree(8)
    put(c, [1, 2, 3])
    node = c.match_prefix([1, 2, 3]).node
    c.evict(3)
    with pytest.raises(ValueError, match="stale"):
        c.lock(node)


# -- eviction order -------------------------------------------------------------------------
def test_eviction_is_lru_over_leaves_and_parents_follow() -> None:
    c = tree(64)
    put(c, [1, 2, 3, 10, 11])  # shared head [1,2,3] with three leaves
    put(c, [1, 2, 3, 20, 21])
    put(c, [1, 2, 3, 30, 31])
    put(c, [5, 6])
    c.match_prefix([1, 2, 3, 10, 11])  # refresh leaf 10 (and the head)
    # LRU leaves now: [20,21] < [30,31] < [5,6] < [10,11]
    assert c.evict(1) == 2
    remaining = c.debug_prefix_map()
    assert (1, 2, 3, 20) not in remaining and (1, 2, 3, 30) in remaining
    assert c.evict(1) == 2
    assert (1, 2, 3, 30) not in c.debug_prefix_map()
    assert c.evict(1) == 2
    assert (5,) not in c.debug_prefix_map()
    # Now the head [1,2,3] is not a leaf yet: [10,11] goes first, then the head follows.
    assert c.evict(1) == 2
    assert c.debug_prefix_map().keys() == {(1,), (1, 2), (1, 2, 3)}
    assert c.evict(1) == 3
    assert c.total_cached() == 0 and c.evict(5) == 0
    c.check_integrity(0)
    assert c.stats.evicted_tokens == 11


def test_shared_ancestor_outlives_leaves() -> None:
    c = tree(64)
    put(c, [9, 9, 9, 1])
    put(c, [9, 9, 9, 2])
    c.match_prefix([7])  # unrelated access does not touch anything
    put(c, [4, 4])
    c.match_prefix([9, 9, 9, 2])
    # [9,9,9,1] leaf is oldest; evicting 2 tokens removes it, then [4,4]; head still there.
    assert c.evict(2) >= 2
    assert (9, 9, 9) in c.debug_prefix_map()
    c.check_integrity(0)


def test_alloc_evicts_only_what_it_needs() -> None:
    c = tree(10)
    put(c, [1, 2, 3])  # oldest
    put(c, [4, 5, 6])
    put(c, [7, 8])
    assert c.free_size == 2
    got = c.alloc(4)  # needs 2 more: evicts the single LRU leaf [1,2,3]
    assert got is not None and len(got) == 4
    assert c.match_prefix([1, 2, 3]).length == 0
    assert c.match_prefix([4, 5, 6]).length == 3
    c.check_integrity(4)


def test_heap_stays_bounded_under_repeated_matches() -> None:
    c = tree(64)
    put(c, [1, 2, 3])
    for _ in range(5000):
        c.match_prefix([1, 2, 3])
    assert len(c._heap) < 600  # lazy entries are compacted
    assert c.evict(3) == 3
    c.check_integrity(0)


# -- reset / integrity ----------------------------------------------------------------------
def test_reset_frees_everything_and_stales_handles() -> None:
    c = tree(16)
    put(c, [1, 2, 3])
    node = c.match_prefix([1, 2, 3]).node
    c.lock(node)
    held = c.alloc(5)
    assert held is not None
    c.check_integrity(5, held)
    c.reset()
    assert c.free_size == 16 and c.total_cached() == 0
    c.unlock(node)  # stale handle: ignored
    with pytest.raises(ValueError, match="stale"):
        c.lock(node)
    assert c.match_prefix([1, 2, 3]).length == 0
    c.check_integrity(0)


def test_check_integrity_catches_leaks_and_corruption() -> None:
    c = tree(16)
    put(c, [1, 2, 3])
    leaked = c.alloc(2)
    assert leaked is not None
    with pytest.raises(AssertionError, match="capacity"):
        c.check_integrity(0)  # two slots unaccounted for
    c.check_integrity(2, leaked)
    with pytest.raises(AssertionError, match="request-owned and free"):
        c.check_integrity(2, [leaked[0], c.allocator.free_list()[0]])
    c._evictable += 1
    with pytest.raises(AssertionError, match="sizes"):
        c.check_integrity(2)
    c._evictable -= 1
    c.allocator.free(c.match_prefix([1]).slots)  # a cached slot freed behind the tree's back
    with pytest.raises(AssertionError, match="both cached and free"):
        c.check_integrity(1)


def test_stats_count_and_time() -> None:
    c = tree(16)
    put(c, [1, 2, 3])
    c.match_prefix([1, 2, 5])
    assert c.stats.inserted_tokens == 3
    assert c.stats.matched_tokens == 2  # the match inside put() found nothing
    assert c.stats.match_calls == 2
    assert c.stats.bookkeeping_seconds > 0


# -- table ablation -------------------------------------------------------------------------
def table(capacity: int = 32) -> TableCache:
    return TableCache(SlotAllocator(capacity, debug=True))


def test_table_matches_only_whole_entries() -> None:
    t = table()
    a = put(t, [1, 2, 3, 4])
    assert t.match_prefix([1, 2, 3, 4, 5]).slots == a
    assert t.match_prefix([1, 2, 3]).length == 0  # a stored sequence is not split
    assert t.match_prefix([1, 2, 3, 4, 5], max_len=3).length == 0
    b = put(t, [1, 2])
    assert t.match_prefix([1, 2, 3, 9]).slots == b
    assert t.match_prefix([1, 2, 3, 4, 9]).slots == a  # longest whole entry wins
    assert set(a).isdisjoint(b)  # [1,2] was recomputed: duplicates cost slots
    assert t.total_cached() == 6
    t.check_integrity(0)


def test_table_shares_slots_only_through_reuse() -> None:
    t = table()
    a = put(t, [1, 2, 3])
    ext = put(t, [1, 2, 3, 4, 5])  # reuses [1,2,3]'s KV
    assert ext[:3] == a and t.total_cached() == 5
    assert t.entries() == {(1, 2, 3): a, (1, 2, 3, 4, 5): ext}
    ext_node = t.match_prefix([1, 2, 3, 4, 5]).node
    t.lock(ext_node)
    assert (t.locked_size, t.evictable_size) == (5, 0)
    # The short entry can go, but frees nothing: its slots live on in the locked extension.
    assert t.evict(1) == 0
    assert t.entries() == {(1, 2, 3, 4, 5): ext}
    t.check_integrity(0)
    t.unlock(ext_node)
    assert t.evict(1) == 5 and t.free_size == 32
    t.check_integrity(0)


def test_table_evicts_whole_entries_lru_and_respects_locks() -> None:
    t = table(10)
    put(t, [1, 2, 3])
    put(t, [4, 5, 6])
    put(t, [7, 8])
    locked = t.match_prefix([1, 2, 3, 0])
    t.lock(locked.node)
    assert (t.locked_size, t.evictable_size) == (3, 5)
    assert t.evict(1) == 3  # [4,5,6] is the LRU unlocked entry
    assert t.match_prefix([4, 5, 6]).length == 0 and t.match_prefix([7, 8, 0]).length == 2
    assert t.alloc(8) is None  # 5 free + 2 evictable
    assert t.evictable_size == 2
    got = t.alloc(7)
    assert got is not None and t.match_prefix([1, 2, 3, 9]).length == 3
    t.check_integrity(7)
    t.free_slots(got)
    t.unlock(locked.node)
    with pytest.raises(ValueError):
        t.unlock(locked.node)
    t.check_integrity(0)


def test_table_insert_existing_frees_copies_and_unfinished() -> None:
    t = table(16)
    a = put(t, [1, 2, 3])
    mine = t.alloc(3)
    assert mine is not None
    assert t.insert([1, 2, 3], mine) == (3, t.match_prefix([1, 2, 3]).node)
    assert t.free_size == 16 - 3
    m = t.match_prefix([1, 2, 3, 4])
    t.lock(m.node)
    more = t.alloc(2)
    assert more is not None
    res = t.cache_unfinished([1, 2, 3, 4, 5], a + more, m.node)
    assert res is not None and res.cached_len == 5
    assert t.entries()[(1, 2, 3, 4, 5)] == a + more
    assert t.locked_size == 5 and t.evictable_size == 0
    other = t.alloc(3)
    assert other is not None
    assert t.cache_unfinished([1, 2, 3], other, t.root) is None  # stored with other slots
    t.free_slots(other)
    t.check_integrity(0)
    t.unlock(res.node)
    t.reset()
    assert t.free_size == 16 and t.total_cached() == 0
    t.check_integrity(0)


# -- no cache -------------------------------------------------------------------------------
def test_no_cache_never_matches_and_frees_on_insert() -> None:
    n = NoCache(SlotAllocator(8, debug=True))
    s = n.alloc(5)
    assert s is not None and n.match_prefix([1, 2, 3]).length == 0
    assert n.alloc(4) is None and n.evict(3) == 0
    res = n.cache_unfinished([1, 2, 3], s[:3], n.match_prefix([1]).node)
    assert res is not None and res.cached_len == 0  # still the request's
    n.check_integrity(5, s)
    assert n.insert([1, 2, 3, 4, 5], s) == (0, n.root)
    assert n.free_size == 8 and n.total_cached() == 0
    n.check_integrity(0)
    with pytest.raises(AssertionError):
        n.check_integrity(1)


# -- factory --------------------------------------------------------------------------------
def test_factory_modes() -> None:
    a = SlotAllocator(4)
    assert isinstance(make_prefix_cache("tree", a), RadixCache)
    assert isinstance(make_prefix_cache("table", a), TableCache)
    assert isinstance(make_prefix_cache("off", a), NoCache)
    with pytest.raises(ValueError, match="unknown"):
        make_prefix_cache("lru", a)


def test_intern_tokens_gives_canonical_objects() -> None:
    a = intern_tokens([int("100000"), 5, int("70000")])
    b = intern_tokens(iter([int("100000"), int("70000")]))
    assert a == [100000, 5, 70000]
    assert a[0] is b[0] and a[2] is b[1]


@pytest.mark.parametrize("mode", ["tree", "table", "off"])
def test_shallow_integrity_check_catches_leaks(mode: str) -> None:
    c = make_prefix_cache(mode, SlotAllocator(16, debug=True))
    put(c, [1, 2, 3])
    held = c.alloc(4)
    assert held is not None
    c.check_integrity(4, deep=False)
    c.check_integrity(4, held)
    with pytest.raises(AssertionError, match="capacity"):
        c.check_integrity(3, deep=False)
