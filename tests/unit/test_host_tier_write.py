"""The host tier's write policies (issue 31, ``--host-tier-write``): write-through copies a
finished path to the host at once, a bounded share per step, so that a later GPU eviction
copies nothing; write-back copies at eviction. The stateful machine
(``tests/unit/test_host_tier.py::TestWriteThroughMachine``) checks the KV contents; these pin
the counts."""

from __future__ import annotations

import pytest

from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.host_tier import HostTier
from scheduler_service.cache.radix_cache import RadixCache
from scheduler_service.config import SchedulerConfig


def _cache(write: str, gpu: int = 8, host: int = 16, budget: int = 0) -> RadixCache:
    c = RadixCache(SlotAllocator(gpu, debug=True), host_capacity=host, host_write=write)
    if budget:
        assert c.host is not None
        c.host.budget = budget
    return c


def _insert(c: RadixCache, toks: list[int]) -> list[int]:
    s = c.alloc(len(toks))
    assert s is not None
    c.insert(toks, s)
    return s


@pytest.mark.parametrize("write", ["write_back", "write_through"])
def test_eviction_copies_only_under_write_back(write: str) -> None:
    c = _cache(write)
    slots = _insert(c, [1, 2, 3, 4])
    host = c.host
    assert host is not None
    first = host.take_copies()  # the step after the request finished
    if write == "write_through":
        assert [(x.to_host, x.src) for x in first] == [(True, slots)]
        assert host.stats.written_through_tokens == 4 and host.held == 4
    else:
        assert first == [] and host.held == 0
    assert c.evict(4) == 4
    second = host.take_copies()  # the step whose allocation evicted it
    if write == "write_through":
        assert second == []  # the host copy is there: eviction only frees the GPU slots
    else:
        assert [(x.to_host, x.src) for x in second] == [(True, slots)]
    assert host.stats.saved_tokens == 4 and host.stats.copy_steps == 1
    m = c.match_prefix([1, 2, 3, 4, 5])
    assert (m.length, m.host_len) == (0, 4)  # either way, a host hit
    c.check_integrity(0, [])


def test_write_through_copies_at_most_the_budget_per_step() -> None:
    c = _cache("write_through", gpu=16, host=32, budget=3)
    slots = _insert(c, list(range(10, 18)))  # one 8-token node
    host = c.host
    assert host is not None
    steps = [host.take_copies() for _ in range(4)]
    per_step = [sum(len(x.src) for x in s) for s in steps]
    assert per_step == [3, 3, 2, 0]  # split at the budget, oldest tokens first
    assert [x.src for s in steps for x in s] == [slots[:3], slots[3:6], slots[6:]]
    assert host.stats.max_step_copy_tokens == 3 and host.stats.written_through_tokens == 8
    c.check_integrity(0, [])
    # Every piece has its host copy: evicting the whole path copies nothing more.
    assert c.evict(8) == 8 and host.take_copies() == [] and host.stats.saved_tokens == 8
    c.check_integrity(0, [])


def test_a_node_evicted_before_its_turn_is_saved_by_write_back() -> None:
    c = _cache("write_through", gpu=8, host=16, budget=2)
    a = _insert(c, [1, 1, 1, 1])
    _insert(c, [2, 2, 2, 2])
    host = c.host
    assert host is not None
    assert [x.src for x in host.take_copies()] == [a[:2]]  # two tokens of the first path
    assert c.evict(8) == 8  # both paths leave the GPU before the queue reaches them
    saves = host.take_copies()  # write-back saves of the rest; the queue is stale now
    assert sum(len(x.src) for x in saves) == 6 and all(x.to_host for x in saves)
    assert host.stats.saved_tokens == 8 and host.stats.written_through_tokens == 2
    assert host.take_copies() == []
    assert c.match_prefix([1, 1, 1, 1, 9]).host_len == 4
    assert c.match_prefix([2, 2, 2, 2, 9]).host_len == 4
    c.check_integrity(0, [])


def test_flush_and_reset_forget_the_write_through_queue() -> None:
    for drop in ("flush", "reset"):
        c = _cache("write_through", budget=1)
        _insert(c, [1, 2, 3])
        host = c.host
        assert host is not None
        assert len(host.take_copies()) == 1  # one token this step, the rest waits
        assert host.pending_write_through == 1
        getattr(c, drop)()
        assert host.pending_write_through == 0 and host.take_copies() == []
        assert host.held == 0
        c.check_integrity(0, [])


def test_unknown_write_policy_and_the_flag() -> None:
    with pytest.raises(ValueError, match="write policy"):
        HostTier(4, lambda n: None, write="write_sometimes")
    assert SchedulerConfig().host_tier_write == "write_back"


def test_write_through_is_queued_before_the_next_allocation_evicts() -> None:
    """A finished path that the very next allocation evicts (a full pool) was already copied
    by write-through: the step carries that copy first and no save of its own."""
    c = _cache("write_through", gpu=4, host=16)
    slots = _insert(c, [1, 2, 3, 4])
    again = c.alloc(4)  # the next step's admission evicts the whole path
    assert again is not None and sorted(again) == sorted(slots)
    host = c.host
    assert host is not None
    copies = host.take_copies()
    assert [(x.to_host, x.src) for x in copies] == [(True, slots)]  # read before reuse
    assert host.stats.written_through_tokens == host.stats.saved_tokens == 4
    assert c.match_prefix([1, 2, 3, 4, 5]).host_len == 4
    c.free_slots(again)
    c.check_integrity(0, [])
