"""Unit tests: ``RadixCache.cache_unfinished`` (one walk) behaves exactly like the composition
it replaced: refuse if the tree holds the tokens in other slots, else ``insert``, ``lock`` the
new node, ``unlock`` the old one. Two caches run the same random chunked-prefill workload, one
through each path; trees, sizes, LFU counters, protection and eviction order must agree."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.prefix_cache import CachedPrefix
from scheduler_service.cache.radix_cache import RadixCache
from scheduler_service.cache.radix_node import RadixNode


def reference_cache_unfinished(
    c: RadixCache, toks: list[int], sl: list[int], old: object
) -> CachedPrefix | None:
    """The pre-fusion implementation, through public calls only."""
    cached = c.debug_prefix_map()  # a read-only peek: no split, no LRU tick
    held: list[int] = []
    while len(held) < len(toks) and tuple(toks[: len(held) + 1]) in cached:
        held.append(cached[tuple(toks[: len(held) + 1])])
    if held != sl[: len(held)]:
        return None
    _, node = c.insert(toks, sl)
    c.lock(node)
    c.unlock(old)
    return CachedPrefix(node, len(toks))


def shape(c: RadixCache) -> list[tuple[object, ...]]:
    out = []
    stack: list[tuple[RadixNode, tuple[int, ...]]] = [(c._root, ())]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            p = path + tuple(child.key)
            out.append(
                (p, tuple(child.value), child.lock_ref, child.direct, child.uses, child.last_access)
            )
            stack.append((child, p))
    return sorted(out)


@dataclass
class Running:
    """One request's hold on a cache: its locked node, its slots, its cached length."""

    node: object
    slots: list[int]
    length: int


class Clock:
    t = 10.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
@pytest.mark.parametrize("seed", range(6))
def test_fused_matches_reference(eviction: str, seed: int) -> None:
    rng = random.Random(seed)
    clock = Clock()
    fused = RadixCache(
        SlotAllocator(400, debug=True), eviction=eviction, protect_s=0.05, clock=clock
    )
    ref = RadixCache(SlotAllocator(400, debug=True), eviction=eviction, protect_s=0.05, clock=clock)
    bases = [[rng.randrange(5) for _ in range(rng.randrange(1, 6))] for _ in range(4)]
    for _ in range(60):
        clock.t += 0.02
        toks = rng.choice(bases) + [rng.randrange(6) for _ in range(rng.randrange(1, 12))]
        state: list[Running] = []
        for c in (fused, ref):
            m = c.match_prefix(toks[:-1])
            c.lock(m.node)
            new = c.alloc(len(toks) - m.length)
            assert new is not None
            state.append(Running(m.node, list(m.slots) + list(new), m.length))
        # Prefill in chunks; occasionally another request caches an overlapping prefix first.
        pos = state[0].length
        while pos < len(toks):
            pos = min(len(toks), pos + rng.randrange(1, 5))
            if rng.random() < 0.2:
                other = toks[: rng.randrange(1, len(toks) + 1)]
                for c in (fused, ref):
                    m = c.match_prefix(other)
                    c.lock(m.node)
                    extra = c.alloc(len(other) - m.length)
                    assert extra is not None
                    c.insert(other, m.slots + extra)
                    c.unlock(m.node)
            a = fused.cache_unfinished(toks[:pos], state[0].slots[:pos], state[0].node)
            b = reference_cache_unfinished(ref, toks[:pos], state[1].slots[:pos], state[1].node)
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                assert a.cached_len == b.cached_len
                state[0].node, state[1].node = a.node, b.node
            assert shape(fused) == shape(ref)
        for c, run in zip((fused, ref), state, strict=True):
            c.insert(toks, run.slots)
            c.unlock(run.node)
            c.check_integrity(0)
        assert shape(fused) == shape(ref)
        assert (fused.evictable_size, fused.locked_size, fused.protected_size) == (
            ref.evictable_size,
            ref.locked_size,
            ref.protected_size,
        )
        if rng.random() < 0.3:
            k = rng.randrange(1, 40)
            assert fused.evict(k) == ref.evict(k)
            assert shape(fused) == shape(ref)


def test_refusal_changes_nothing_and_bad_unlock_raises_before_any_change() -> None:
    c = RadixCache(SlotAllocator(32, debug=True))
    mine = c.alloc(4)
    assert mine is not None
    other = c.alloc(3)
    assert other is not None
    c.insert([1, 2, 3], other)
    before = shape(c)
    assert c.cache_unfinished([1, 2, 3, 4], mine, c.root) is None
    assert shape(c) == before
    m = c.match_prefix([1, 2])  # not locked by anyone
    before = shape(c)
    with pytest.raises(ValueError):
        c.cache_unfinished([1, 2, 3, 9], other + [mine[0]], m.node)
    assert shape(c) == before and c.locked_size == 0
    c.check_integrity(4)
