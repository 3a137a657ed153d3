"""Unit tests: radix-cache eviction order (lru / lfu) and insert protection with admission.

The protection scenario is the chat pathology in miniature: a session's turn has just finished
(its context is cached), a request that reuses nothing waits, and the session's follow-up
arrives a moment later. Plain LRU admits the stranger first and evicts the context; protection
keeps it for the follow-up. Hits are exact token counts.
"""

from __future__ import annotations

import pytest

from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.prefix_cache import make_prefix_cache
from scheduler_service.cache.radix_cache import RadixCache
from scheduler_service.planner.prefill_adder import admit_prefills
from tests.unit.queue_item import Item


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def seq(tag: int, n: int) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


def finish(cache: RadixCache, tokens: list[int]) -> None:
    """A request computed ``tokens`` (no cached prefix) and finished: its KV enters the cache."""
    slots = cache.alloc(len(tokens))
    assert slots is not None
    cache.insert(tokens, slots)


def follow_up_scenario(protect_s: float) -> tuple[int, list[str]]:
    """Pool 40: a running request owns 10 slots, session A's finished turn holds 20 cached
    tokens, 10 are free. A stranger needing 15 new slots waits; then A's follow-up (A's 20
    tokens + 5 new) arrives. Returns (what the follow-up finds cached, what was admitted)."""
    clock = Clock()
    cache = RadixCache(SlotAllocator(40, debug=True), protect_s=protect_s, clock=clock)
    background = cache.alloc(10)  # request-owned by the running request
    assert background is not None
    context = seq(1, 20)
    finish(cache, context)
    order: list[str] = []
    stranger = Item(seq(2, 15), arrival=1)
    plan = admit_prefills([stranger], cache, chunk_budget=64, max_running=8, num_running=1)
    order += ["stranger"] * len(plan.admitted)
    clock.t += 0.01  # the follow-up call arrives milliseconds later
    follow = Item(context + seq(3, 5), arrival=2)
    plan2 = admit_prefills([follow], cache, chunk_budget=64, max_running=8, num_running=1)
    order += ["follow-up"] * len(plan2.admitted)
    assert follow.match is not None
    cache.check_integrity(10 + sum(len(a.new_slots) for a in [*plan.admitted, *plan2.admitted]))
    return follow.match.length, order


def test_lru_evicts_the_context_a_follow_up_needs() -> None:
    hit, order = follow_up_scenario(protect_s=0.0)
    assert hit == 0  # the stranger's 15 slots came from A's 20-token context
    assert order == ["stranger"]  # and the follow-up, now 25 new tokens, does not even fit


def test_protection_keeps_it_for_the_follow_up() -> None:
    hit, order = follow_up_scenario(protect_s=0.1)
    assert order == ["follow-up"]  # the stranger waits: the free 10 slots are not enough
    assert hit == 20


def test_protection_expires_and_never_idles_the_model() -> None:
    clock = Clock()
    cache = RadixCache(SlotAllocator(30, debug=True), protect_s=0.1, clock=clock)
    finish(cache, seq(1, 20))
    assert cache.protected_size == 20
    stranger = Item(seq(2, 15), arrival=1)
    blocked = admit_prefills([stranger], cache, chunk_budget=64, max_running=8, num_running=1)
    assert blocked.admitted == [] and blocked.stop_reason == "memory"
    # Nothing running: protection must not leave the model idle.
    idle = admit_prefills([stranger], cache, chunk_budget=64, max_running=8, num_running=0)
    assert [a.item for a in idle.admitted] == [stranger]
    assert cache.evictable_size == 0  # eviction takes whole leaves: all 20 went
    cache.check_integrity(15)


def test_protection_window_ends() -> None:
    clock = Clock()
    cache = RadixCache(SlotAllocator(30, debug=True), protect_s=0.1, clock=clock)
    finish(cache, seq(1, 20))
    stranger = Item(seq(2, 15), arrival=1)
    assert not admit_prefills(
        [stranger], cache, chunk_budget=64, max_running=8, num_running=1
    ).admitted
    clock.t += 0.1
    assert cache.protected_size == 0
    plan = admit_prefills([stranger], cache, chunk_budget=64, max_running=8, num_running=1)
    assert [a.item for a in plan.admitted] == [stranger]


def test_protected_size_tracks_locks_splits_and_paths() -> None:
    clock = Clock()
    cache = RadixCache(SlotAllocator(64, debug=True), protect_s=1.0, clock=clock)
    base = seq(1, 10)
    finish(cache, base + seq(2, 5))
    clock.t += 2.0  # expired
    assert cache.protected_size == 0
    # A second request shares the first 10 tokens: the insert splits the edge and stamps the
    # whole path (the shared 10 and its own 6), not the sibling's 5.
    m = cache.match_prefix(base + seq(3, 6), 10)
    cache.lock(m.node)
    new = cache.alloc(6)
    assert new is not None
    cache.insert(base + seq(3, 6), m.slots + new)
    assert cache.protected_size == 6  # the shared 10 are still locked by the request
    cache.unlock(m.node)
    assert cache.protected_size == 16
    cache.check_integrity(0)
    m2 = cache.match_prefix(base + seq(3, 6))
    cache.lock(m2.node)
    assert cache.protected_size == 0  # locked tokens are not evictable, so not protected
    cache.unlock(m2.node)
    clock.t += 1.0
    assert cache.protected_size == 0


def test_lfu_evicts_least_used_leaf_where_lru_evicts_the_oldest() -> None:
    def run(eviction: str) -> bool:
        """True if the often-used (but older) leaf survives one 5-token eviction."""
        cache = RadixCache(SlotAllocator(10, debug=True), eviction=eviction)
        hot, cold = seq(1, 5), seq(2, 5)
        finish(cache, hot)
        for _ in range(3):  # three requests ran through `hot`
            m = cache.match_prefix(hot)
            cache.lock(m.node)
            cache.unlock(m.node)
        finish(cache, cold)  # more recent, never used
        assert cache.evict(5) == 5
        cache.check_integrity(0)
        return cache.match_prefix(hot).length == 5

    assert run("lfu") is True
    assert run("lru") is False


def test_options_are_validated() -> None:
    alloc = SlotAllocator(8)
    with pytest.raises(ValueError, match="eviction"):
        make_prefix_cache("tree", alloc, eviction="mru")
    with pytest.raises(ValueError, match="protect_s"):
        RadixCache(alloc, protect_s=-1.0)
    for mode in ("table", "off"):  # the ablations accept and ignore the options
        c = make_prefix_cache(mode, SlotAllocator(8), eviction="lfu", protect_s=1.0)
        assert c.protected_size == 0
    tree = make_prefix_cache("tree", SlotAllocator(8), eviction="lfu", protect_s=0.5)
    assert isinstance(tree, RadixCache) and tree.eviction == "lfu" and tree.protect_s == 0.5
