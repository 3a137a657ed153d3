"""Load-ahead in the scheduler (issue 31): a request whose prefix is loaded from the host tier
is admitted *loading* in the step that carries the load (handle and locked prefix, no row) and
sends its ADMIT in the next step; cancelled, retracted or lost while loading, it gives back
everything it held. The step builder against a real radix tree with a host tier (the model
side of the rule is tests/unit/test_kv_load_ahead.py)."""

from __future__ import annotations

import pytest

from radixmesh_wire.step_ops import StepOutcome
from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.prefix_cache import make_prefix_cache
from scheduler_service.config import SchedulerConfig
from scheduler_service.continuations import requeue_running
from scheduler_service.planner.batch_builder import BatchBuilder, PlannedStep
from scheduler_service.planner.output_processor import apply_result
from scheduler_service.planner.policy import SchedulePolicy
from scheduler_service.planner.prefill_adder import admit_prefills
from scheduler_service.request import Phase, Request, SamplingSpec
from scheduler_service.state import SchedState
from tests.unit.queue_item import Item

GPU, HOST = 32, 64
DOC = list(range(100, 112))  # 12 tokens, evicted to the host before the test's request


def _req(rid: str, prompt: list[int]) -> Request:
    spec = SamplingSpec(temperature=0, max_new_tokens=2, ignore_eos=True)
    return Request(rid=rid, session="s", prompt=prompt, spec=spec, eos_ids=frozenset())


def _state() -> tuple[SchedState, BatchBuilder]:
    cache = make_prefix_cache("tree", SlotAllocator(GPU, debug=True), host_capacity=HOST)
    st = SchedState(cache=cache, context_length=512)
    builder = BatchBuilder(SchedulerConfig(host_kv_tokens=HOST), st, SchedulePolicy("fcfs"))
    slots = cache.alloc(len(DOC))
    assert slots is not None
    cache.insert(DOC, slots)
    assert cache.evict(len(DOC)) == len(DOC)  # saved to the host, host-only in the tree
    host = getattr(cache, "host", None)
    assert host is not None and host.held == len(DOC)
    host.take_copies()  # as if a step had carried the save
    return st, builder


def _apply(st: SchedState, plan: PlannedStep) -> None:
    """The model answers token 7 for every sampling row."""
    n = len(plan.sampling)
    apply_result(st, plan, StepOutcome(plan.ops.step_id, plan.sampling, [7] * n, [0.0] * n))
    st.check_integrity()


def _counts(st: SchedState) -> tuple[int, int, int, int]:
    c = st.cache
    return c.free_size + c.evictable_size, c.locked_size, st.request_owned(), len(st.running)


def _loads(plan: PlannedStep) -> list[int]:
    return [s for c in plan.ops.copies if not c.to_host for s in c.dst]


def test_a_host_hit_joins_the_step_after_its_load_and_a_reader_waits_with_it() -> None:
    st, builder = _state()
    r = _req("r", DOC + [5])
    other = _req("o", [1, 2, 3])
    reader = _req("x", DOC[:6] + [9])  # reads a prefix that r's admission loads
    st.waiting.extend([r, other, reader])
    plan = builder.build()
    loaded = _loads(plan)
    assert len(loaded) == len(DOC)
    # The step carrying the load computes only the unrelated request.
    assert [a.rid for a in plan.ops.admits] == ["o"] and not plan.ops.extends
    assert r.phase is Phase.LOADING and reader.phase is Phase.LOADING
    assert r.kv_slots == loaded and reader.kv_slots == loaded[:6]
    host = getattr(st.cache, "host", None)
    assert host is not None and host.stats.load_waits == 2
    assert host.stats.loading_requests == 2
    _apply(st, plan)  # the integrity check, with both loading
    nxt = builder.build()
    assert not _loads(nxt)
    admits = {a.rid: a for a in nxt.ops.admits}
    assert admits["r"].prefix_slots == loaded and admits["r"].input_ids == [5]
    assert admits["x"].prefix_slots == loaded[:6] and admits["x"].input_ids == [9]
    assert r.phase is Phase.DECODE and host.stats.loading_requests == 0
    _apply(st, nxt)
    while st.running:  # to the end: each finishes with its KV cached
        _apply(st, builder.build())
    assert st.cache.locked_size == 0 and st.request_owned() == 0


def test_a_request_cancelled_while_its_prefix_loads_frees_everything() -> None:
    st, builder = _state()
    before = _counts(st)
    r = _req("r", DOC + [5])
    st.waiting.append(r)
    plan = builder.build()
    assert r.phase is Phase.LOADING and st.cache.locked_size == len(DOC)
    handle = r.handle
    st.release(r, insert=True)  # what Scheduler._reap_aborted does between steps
    st.check_integrity()
    assert _counts(st) == before  # the loaded prefix stays cached, evictable, both tiers
    _apply(st, plan)
    nxt = builder.build()
    assert not nxt.ops.admits and nxt.ops.releases == [handle]
    assert _counts(st) == before


def test_retracted_or_lost_while_loading_it_waits_again_with_nothing_held() -> None:
    st, builder = _state()
    before = _counts(st)
    r = _req("r", DOC + [5])
    st.waiting.append(r)
    builder.build()
    assert r.phase is Phase.LOADING
    st.requeue(r, insert=True)  # retraction's path
    st.check_integrity()
    assert r.phase is Phase.WAITING and st.waiting == [r] and _counts(st) == before
    plan = builder.build()  # admitted again: its prefix is on the GPU now, no load
    assert not _loads(plan) and [a.rid for a in plan.ops.admits] == ["r"]
    assert plan.ops.admits[0].prefix_slots == r.kv_slots[: len(DOC)]
    _apply(st, plan)

    st2, builder2 = _state()
    r2 = _req("r2", DOC + [5])
    st2.waiting.append(r2)
    builder2.build()
    assert r2.phase is Phase.LOADING
    assert requeue_running(st2) == [r2]  # the model service is lost, with the pending load
    st2.check_integrity()
    assert r2.phase is Phase.WAITING and st2.cache.free_size == GPU
    host = getattr(st2.cache, "host", None)
    assert host is not None and host.held == 0 and not host.loading


def test_a_loading_admission_keeps_its_lock_when_the_step_cannot_allocate() -> None:
    """If the step's one allocation fails after a load was queued (budget arithmetic should
    make it unreachable), the loading admission stays admitted and locked: unlocked, its
    loaded prefix could be evicted and reused while the load writes it."""
    st, _ = _state()
    cache = st.cache
    real = cache.alloc
    calls: list[int] = []

    def alloc(n: int) -> list[int] | None:  # the load's allocation works, the step's fails
        calls.append(n)
        return real(n) if len(calls) == 1 else None

    cache.alloc = alloc  # type: ignore[method-assign]
    host_hit, cold = Item(DOC + [5], 0), Item([1, 2, 3], 1)
    plan = admit_prefills([host_hit, cold], cache, chunk_budget=8, max_running=4, num_running=0)
    assert plan.stop_reason == "continuation_blocked" and plan.continuation_slots is None
    assert [(a.item, a.loading, a.n_tokens) for a in plan.admitted] == [(host_hit, True, 0)]
    assert calls == [len(DOC), 3, 0]  # the load, the step, the step without the cold one
    assert cache.locked_size == len(DOC)  # the cold one was unlocked, the loading one not
    cache.check_integrity(0, deep=False)


def test_the_integrity_check_catches_a_loading_request_with_slots_of_its_own() -> None:
    st, builder = _state()
    r = _req("r", DOC + [5, 6])
    st.waiting.append(r)
    builder.build()
    st.check_integrity()
    slots = st.cache.alloc(1)
    assert slots is not None
    r.extend(slots)  # a row's slots given while it is still loading: a scheduler bug
    assert r.phase is Phase.LOADING
    with pytest.raises(AssertionError, match="is loading but owns 1 slots"):
        st.check_integrity()
