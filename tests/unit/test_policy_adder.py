"""Unit tests: waiting-queue policies, in-batch prefix sharing, prefill admission, retraction."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.no_cache import NoCache
from scheduler_service.cache.prefix_cache import PrefixCache
from scheduler_service.cache.radix_cache import RadixCache
from scheduler_service.cache.table_cache import TableCache
from scheduler_service.config import SchedulerConfig
from scheduler_service.planner.batch_builder import BatchBuilder
from scheduler_service.planner.policy import SchedulePolicy, deprioritize_shared_uncached
from scheduler_service.planner.prefill_adder import (
    NewTokenRatio,
    admit_prefills,
    decode_reservation,
)
from scheduler_service.planner.retraction import plan_retraction, retraction_order
from scheduler_service.state import SchedState
from tests.unit.queue_item import Item


@dataclass
class Running:
    name: str
    prompt_len: int
    output_len: int
    max_new_tokens: int


def tree(capacity: int = 256) -> RadixCache:
    return RadixCache(SlotAllocator(capacity, debug=True))


def cache_tokens(cache: PrefixCache, tokens: list[int]) -> None:
    m = cache.match_prefix(tokens)
    cache.lock(m.node)
    new = cache.alloc(len(tokens) - m.length)
    assert new is not None
    cache.insert(tokens, m.slots + new)
    cache.unlock(m.node)


def seq(tag: int, n: int) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


def arrivals(items: list[Item]) -> list[int]:
    return [w.arrival for w in items]


# -- policies -------------------------------------------------------------------------------
def test_fcfs_lof_and_random() -> None:
    c = tree()
    items = [
        Item(seq(i, 3), arrival=a, max_new_tokens=m)
        for i, (a, m) in enumerate([(2, 5), (0, 9), (1, 9), (3, 1)])
    ]
    assert arrivals(SchedulePolicy("fcfs").order(items, c)) == [0, 1, 2, 3]
    assert all(w.match is None for w in items)  # FCFS never matches
    lof = SchedulePolicy("lof").order(items, c)
    assert [w.max_new_tokens for w in lof] == [9, 9, 5, 1] and arrivals(lof)[:2] == [0, 1]
    r1 = arrivals(SchedulePolicy("random", seed=1).order(items, c))
    assert sorted(r1) == [0, 1, 2, 3]
    assert r1 == arrivals(SchedulePolicy("random", seed=1).order(list(reversed(items)), c))
    orders = {tuple(arrivals(SchedulePolicy("random", seed=s).order(items, c))) for s in range(8)}
    assert len(orders) > 1
    with pytest.raises(ValueError):
        SchedulePolicy("sjf")


def test_lpm_orders_by_match_then_arrival_and_caps_matches() -> None:
    c = tree()
    cache_tokens(c, seq(1, 10))
    cache_tokens(c, seq(2, 4))
    a = Item(seq(9, 5), arrival=0)  # no match
    b = Item(seq(2, 4) + [7], arrival=1)  # 4
    d = Item(seq(1, 10) + [7], arrival=2)  # 10
    e = Item(seq(1, 10), arrival=3)  # fully cached: capped at len - 1 = 9
    f = Item(seq(1, 10) + [8], arrival=4, prefix_limit=2)  # prompt logprobs from 3: 2
    g = Item(seq(2, 6), arrival=5)  # 4, ties with b: arrival decides
    out = SchedulePolicy("lpm").order([a, b, d, e, f, g], c)
    assert arrivals(out) == [2, 3, 1, 5, 4, 0]
    assert [w.match.length for w in out if w.match] == [10, 9, 4, 4, 2, 0]


def test_lpm_falls_back_to_fcfs_above_threshold() -> None:
    c = tree()
    cache_tokens(c, seq(1, 8))
    pol = SchedulePolicy("lpm", lpm_fallback_queue_len=3)
    items = [Item(seq(5, 4), 0), Item(seq(6, 4), 1), Item(seq(1, 8) + [1], 2)]
    assert arrivals(pol.order(items, c)) == [2, 0, 1]  # at the threshold: still LPM
    calls = c.stats.match_calls
    more = [*items, Item(seq(7, 4), 3)]
    for w in more:
        w.match = None
    assert pol.effective_name(4) == "fcfs"
    assert arrivals(pol.order(more, c)) == [0, 1, 2, 3]
    assert c.stats.match_calls == calls and all(w.match is None for w in more)
    dfs = SchedulePolicy("dfs-weight", lpm_fallback_queue_len=3)
    assert dfs.effective_name(4) == "fcfs" and SchedulePolicy("lof").effective_name(10**6) == "lof"


def test_dfs_weight_groups_heavy_subtrees_and_deeper_matches_first() -> None:
    c = tree()
    head = seq(1, 4)
    cache_tokens(c, head + seq(2, 4))  # branch X under the shared head
    cache_tokens(c, head + seq(3, 4))  # branch Y under the shared head
    cache_tokens(c, seq(4, 6))  # unrelated branch Z
    x1 = Item(head + seq(2, 4) + [1], arrival=0)  # deep in X
    z1 = Item(seq(4, 6) + [1], arrival=1)
    y1 = Item(head + seq(3, 4) + [1], arrival=2)
    y2 = Item(head + seq(3, 4) + [2], arrival=3)
    h1 = Item(head + [77], arrival=4)  # matches only the head
    n1 = Item(seq(9, 3), arrival=5)  # matches nothing
    y3 = Item(head + seq(3, 2) + [5], arrival=6)  # splits Y mid-edge
    out = SchedulePolicy("dfs-weight").order([x1, z1, y1, y2, h1, n1, y3], c)
    # head subtree (weight 5) before Z (1); inside it Y (3) before X (1); inside Y the deep
    # node (y1, y2) before its split parent (y3); head's own request after its children;
    # the root's own (unmatched) request last.
    assert arrivals(out) == [2, 3, 6, 0, 4, 1, 5]


def test_dfs_weight_works_on_table_and_no_cache() -> None:
    t = TableCache(SlotAllocator(64, debug=True))
    cache_tokens(t, seq(1, 3))
    cache_tokens(t, seq(2, 3))
    items = [
        Item(seq(1, 3) + [1], 0),
        Item(seq(2, 3) + [1], 1),
        Item(seq(2, 3) + [2], 2),
        Item(seq(5, 2), 3),
    ]
    assert arrivals(SchedulePolicy("dfs-weight").order(items, t)) == [1, 2, 0, 3]
    n = NoCache(SlotAllocator(8))
    assert arrivals(SchedulePolicy("dfs-weight").order(items[::-1], n)) == [0, 1, 2, 3]
    assert SchedulePolicy("dfs-weight").order([], n) == []


def test_in_batch_prefix_sharing_defers_all_but_one() -> None:
    c = tree(512)
    cache_tokens(c, seq(1, 20))
    shared = seq(2, 40)  # uncached, shared by three requests
    a = Item(shared + [1], 0)
    b = Item(shared + [2], 1)
    d = Item(seq(1, 20) + shared + [3], 2)  # same uncached run, but after a cached prefix
    e = Item(seq(1, 20) + shared + [4], 3)
    f = Item(shared[:20] + [5], 4)  # shares only 20 tokens: below the threshold
    g = Item(seq(3, 10), 5)  # short prompt: never deferred
    pol = SchedulePolicy("lpm", in_batch_prefix_threshold=32)
    now, later = pol.schedule([a, b, d, e, f, g], c)
    assert arrivals(now) == [2, 0, 4, 5] and arrivals(later) == [3, 1]
    assert SchedulePolicy("fcfs").schedule([a, b, d, e], c) == ([a, b, d, e], [])
    assert SchedulePolicy("lpm", in_batch_prefix_threshold=0).schedule([a, b], c)[1] == []
    # The helper on its own: items without a match count as matching nothing.
    x, y = Item(shared, 0), Item(shared + [9], 1)
    assert deprioritize_shared_uncached([x, y], 32) == ([x], [y])


def test_requests_the_cache_may_not_serve_are_never_deferred() -> None:
    """Prompt logprobs from position 0: the shared run would be computed again anyway, so
    deferring the second request gains nothing (issue 26 item 2)."""
    shared = seq(2, 40)
    x, y = Item(shared + [1], 0, prefix_limit=0), Item(shared + [2], 1, prefix_limit=0)
    assert deprioritize_shared_uncached([x, y], 32) == ([x, y], [])
    z = Item(shared + [3], 2, prefix_limit=35)  # may take 35 of them: deferral pays
    assert deprioritize_shared_uncached([x, z], 32) == ([x], [z])


# -- admission ------------------------------------------------------------------------------
def test_admission_respects_memory_budget_and_locks_prefixes() -> None:
    c = tree(100)
    cache_tokens(c, seq(1, 30))
    cache_tokens(c, seq(4, 10))  # 40 evictable, 60 free
    items = [
        Item(seq(1, 30) + seq(2, 20), 0, max_new_tokens=10),  # needs 20 + 10*0.5
        Item(seq(3, 40), 1, max_new_tokens=10),  # needs 40 + 5: exactly what is left
        Item(seq(4, 10) + seq(5, 20), 2),
    ]  # needs 20: refused
    plan = admit_prefills(
        items,
        c,
        chunk_budget=1000,
        max_running=10,
        num_running=0,
        reserved_tokens=0,
        new_token_ratio=0.5,
    )
    assert [a.item.arrival for a in plan.admitted] == [0, 1]
    assert plan.stop_reason == "memory"
    first, second = plan.admitted
    assert first.prefix_len == 30 and first.n_tokens == 20 and len(first.new_slots) == 20
    assert second.prefix_len == 0 and second.n_tokens == 40 and not second.chunked
    assert c.locked_size == 30  # the admitted prefix is protected...
    assert c.evictable_size == 10  # ...the refused one's was unlocked again, and not evicted
    owned = first.new_slots + second.new_slots
    c.check_integrity(len(owned), owned)
    assert set(owned).isdisjoint(first.match.slots)


def test_admission_never_over_admits_against_reservation() -> None:
    c = tree(100)
    items = [Item(seq(i, 10), i, max_new_tokens=0) for i in range(10)]
    plan = admit_prefills(
        items, c, chunk_budget=1000, max_running=100, num_running=3, reserved_tokens=55.5
    )
    assert len(plan.admitted) == 4 and plan.stop_reason == "memory"  # 100 - 55.5 -> 44.5
    plan2 = admit_prefills(
        items[4:], c, chunk_budget=1000, max_running=100, num_running=7, reserved_tokens=0
    )
    assert len(plan2.admitted) == 6 and plan2.stop_reason == "drained"
    assert c.free_size == 0
    assert (
        admit_prefills([Item([1], 99)], c, chunk_budget=10, max_running=100, num_running=0).admitted
        == []
    )


def test_evicting_for_admission_never_touches_selected_prefixes() -> None:
    c = tree(70)
    cache_tokens(c, seq(1, 20))  # oldest: would be evicted first by LRU...
    cache_tokens(c, seq(2, 20))
    cache_tokens(c, seq(3, 20))  # 10 free: the 30 new slots need 20 evicted
    items = [Item(seq(1, 20) + seq(5, 20), 0), Item(seq(3, 20) + seq(6, 10), 1)]
    plan = admit_prefills(items, c, chunk_budget=1000, max_running=10, num_running=0)
    assert len(plan.admitted) == 2
    assert c.match_prefix(seq(1, 20)).length == 20  # ...but it was locked for item 0
    assert c.match_prefix(seq(3, 20)).length == 20
    assert c.match_prefix(seq(2, 20)).length == 0  # the unlocked one made room
    owned = [s for a in plan.admitted for s in a.new_slots]
    c.check_integrity(len(owned), owned)


def test_chunked_prefill_and_continuation() -> None:
    c = tree(100)
    big = Item(seq(1, 25), 0)
    small = Item(seq(2, 5), 1)
    plan = admit_prefills([big, small], c, chunk_budget=10, max_running=10, num_running=0)
    (a,) = plan.admitted
    assert a.n_tokens == 10 and a.chunked and a.end == 10 and plan.stop_reason == "chunked"
    assert plan.continuation_slots == []
    # Next step: 15 tokens left for the chunked one. It is sure of half the budget (5); the
    # small one (5 tokens) fits whole in the other half, so it does not wait for the big one.
    plan2 = admit_prefills(
        [small], c, chunk_budget=10, max_running=10, num_running=1, chunked_remaining=15
    )
    assert plan2.continuation_slots is not None and len(plan2.continuation_slots) == 5
    (s,) = plan2.admitted
    assert s.n_tokens == 5 and not s.chunked and plan2.tokens_this_step == 10
    # Nothing new: the continuation takes the whole budget.
    nothing: list[Item] = []
    plan3 = admit_prefills(
        nothing, c, chunk_budget=10, max_running=10, num_running=2, chunked_remaining=10
    )
    assert plan3.continuation_slots is not None and len(plan3.continuation_slots) == 10
    owned = a.new_slots + plan2.continuation_slots + plan3.continuation_slots + s.new_slots
    c.check_integrity(len(owned), owned)
    assert len(set(owned)) == 30


def test_a_newcomer_is_chunked_beside_the_head_and_others_come_first() -> None:
    """A prompt longer than the half of the budget the head leaves starts at once, chunked
    (issue 26: it used to wait for the head's whole prefill); requests already mid-prefill are
    served before newcomers, fewest tokens left first; what is left goes to the head."""
    c = tree(200)
    newcomer = Item(seq(3, 8), 0)
    plan = admit_prefills(
        [newcomer], c, chunk_budget=10, max_running=10, num_running=1, chunked_remaining=15
    )
    (a,) = plan.admitted
    assert a.n_tokens == 5 and a.chunked and plan.stop_reason == "chunked"
    assert plan.continuation_slots is not None and len(plan.continuation_slots) == 5
    # Next step: head (12 left), the newcomer (3 left) and a third request.
    third = Item(seq(4, 2), 1)
    plan2 = admit_prefills(
        [third], c, chunk_budget=10, max_running=10, num_running=2, chunked_remaining=[12, 3]
    )
    assert plan2.continuation_slots is not None and len(plan2.continuation_slots) == 5
    assert [len(s) for s in plan2.more_slots] == [3]
    (t,) = plan2.admitted
    assert t.n_tokens == 2 and not t.chunked and plan2.tokens_this_step == 10
    # Two others: the one with fewer tokens left first; nothing left for newcomers.
    plan3 = admit_prefills(
        [Item(seq(5, 4), 2)],
        c,
        chunk_budget=10,
        max_running=10,
        num_running=3,
        chunked_remaining=[20, 9, 4],
    )
    assert plan3.admitted == [] and plan3.stop_reason == "chunk_budget"
    assert [len(s) for s in plan3.more_slots] == [1, 4]  # 5 for the head, 4 then 1
    owned = [s for p in (plan, plan2, plan3) for s in (p.continuation_slots or [])]
    owned += [s for p in (plan, plan2, plan3) for m in p.more_slots for s in m]
    owned += a.new_slots + t.new_slots
    assert len(set(owned)) == len(owned) == 30
    assert c.locked_size == 0


def test_the_head_progresses_when_memory_is_short_for_every_prefill() -> None:
    c = tree(10)
    assert c.alloc(4) is not None  # 6 free
    nothing: list[Item] = []
    plan = admit_prefills(
        nothing, c, chunk_budget=10, max_running=5, num_running=2, chunked_remaining=[20, 4]
    )
    assert plan.continuation_slots is not None and len(plan.continuation_slots) == 5
    assert plan.more_slots == [[]] and c.free_size == 1


def test_continuation_blocked_and_max_running() -> None:
    c = tree(10)
    assert c.alloc(8) is not None
    plan = admit_prefills(
        [Item([1, 2], 0)], c, chunk_budget=10, max_running=5, num_running=1, chunked_remaining=5
    )
    assert plan.continuation_slots is None and plan.stop_reason == "continuation_blocked"
    assert c.free_size == 2
    c2 = tree(100)
    items = [Item(seq(i, 2), i) for i in range(5)]
    plan = admit_prefills(items, c2, chunk_budget=100, max_running=4, num_running=2)
    assert len(plan.admitted) == 2 and plan.stop_reason == "max_running"


def test_one_token_is_always_computed_and_prefix_limit_is_respected() -> None:
    c = tree(100)
    cache_tokens(c, seq(1, 12))
    full = Item(seq(1, 12), 0)
    logp = Item(seq(1, 12) + [5], 1, prefix_limit=3)
    plan = admit_prefills([full, logp], c, chunk_budget=100, max_running=10, num_running=0)
    a, b = plan.admitted
    assert (a.prefix_len, a.n_tokens) == (11, 1)
    assert (b.prefix_len, b.n_tokens) == (3, 10)
    with pytest.raises(ValueError):
        admit_prefills([Item([], 2)], c, chunk_budget=10, max_running=10, num_running=0)


def test_admission_with_table_and_no_cache() -> None:
    for cache in (TableCache(SlotAllocator(50, debug=True)), NoCache(SlotAllocator(50))):
        cache_tokens(cache, seq(1, 10))
        plan = admit_prefills(
            [Item(seq(1, 10) + [1], 0)], cache, chunk_budget=100, max_running=10, num_running=0
        )
        (a,) = plan.admitted
        hit = 10 if isinstance(cache, TableCache) else 0
        assert a.prefix_len == hit and a.n_tokens == 11 - hit
        cache.check_integrity(len(a.new_slots), a.new_slots)


# -- decode reservation, ratio, retraction --------------------------------------------------
def test_decode_reservation_and_new_token_ratio() -> None:
    running = [Running("a", 10, 2, 12), Running("b", 5, 20, 10), Running("c", 1, 0, 10**6)]
    assert decode_reservation(running, 0.5, clip=100) == (10 + 0 + 100) * 0.5
    r = NewTokenRatio(init=0.7, minimum=0.1, decay_steps=6)
    values = [r.step() for _ in range(8)]
    assert values[0] == pytest.approx(0.6) and values[-1] == pytest.approx(0.1)
    assert r.on_retract() == pytest.approx(0.7)
    assert r.on_retract(observed=0.9) == pytest.approx(0.9)
    assert r.on_retract(observed=3.0) == 1.0
    with pytest.raises(ValueError):
        NewTokenRatio(init=0.1, minimum=0.5)


def test_a_configured_ratio_below_the_floor_is_its_own_floor() -> None:
    """`--new-token-ratio 0`: admission reserves nothing for future decodes, and stays so."""
    st = SchedState(cache=RadixCache(SlotAllocator(64)), context_length=64)
    ratio = BatchBuilder(SchedulerConfig(new_token_ratio=0.0), st, SchedulePolicy("fcfs")).ratio
    assert ratio.value == ratio.step() == ratio.on_retract() == 0.0
    ratio = BatchBuilder(SchedulerConfig(), st, SchedulePolicy("fcfs")).ratio
    assert (ratio.init, ratio.minimum) == (0.7, NewTokenRatio.FLOOR)


def test_retraction_order_and_plan() -> None:
    running = [
        Running("old", prompt_len=50, output_len=40, max_new_tokens=100),
        Running("young-long-prompt", prompt_len=80, output_len=2, max_new_tokens=10),
        Running("young-long-tail", prompt_len=10, output_len=2, max_new_tokens=500),
        Running("fresh", prompt_len=5, output_len=0, max_new_tokens=10),
    ]
    order = [r.name for r in retraction_order(running)]
    assert order == ["fresh", "young-long-tail", "young-long-prompt", "old"]
    assert plan_retraction(running, 0) == []
    assert [r.name for r in plan_retraction(running, 6)] == ["fresh"]  # 5 + 0 + 1
    assert [r.name for r in plan_retraction(running, 7)] == ["fresh", "young-long-tail"]
    most = plan_retraction(running, 10**6)
    assert len(most) == 3 and "old" not in [r.name for r in most]  # keeps one running
    every = plan_retraction(running, 10**6, keep=0)
    assert len(every) == 4
    only_owned = plan_retraction(running, 3, freed=lambda r: 0, per_request_need=1)
    assert len(only_owned) == 3


# -- speed ----------------------------------------------------------------------------------
def test_hot_paths_are_fast() -> None:
    """Loose guard (shared CI machine): LPM over 128 waiting + admission, and a decode-step
    worth of cache work for 256 running requests."""
    c = tree(300_000)
    system = seq(1, 500)
    for i in range(64):
        cache_tokens(c, system + seq(100 + i, 300))
    waiting = [
        Item(system + seq(100 + i % 64, 300) + seq(5000 + i, 200), i, 64) for i in range(128)
    ]
    pol = SchedulePolicy("lpm")
    t0 = time.perf_counter()
    for _ in range(10):
        for w in waiting:
            w.match = None
        ordered = pol.order(waiting, c)
    lpm_ms = (time.perf_counter() - t0) / 10 * 1e3
    plan = admit_prefills(ordered, c, chunk_budget=2048, max_running=512, num_running=0)
    assert plan.admitted
    nodes = [c.match_prefix(system + seq(100 + i % 64, 300)).node for i in range(256)]
    t0 = time.perf_counter()
    for _ in range(50):
        for n in nodes:
            c.lock(n)
        got = c.alloc(256)
        assert got is not None
        c.free_slots(got)
        for n in nodes:
            c.unlock(n)
    step_ms = (time.perf_counter() - t0) / 50 * 1e3
    print(f"lpm order {lpm_ms:.1f} ms, lock+alloc step {step_ms:.2f} ms")  # figures, not bounds
