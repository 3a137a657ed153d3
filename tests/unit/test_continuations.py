"""Model lost: running requests go back to the queue as continuations with nothing allocated,
and the next model session re-prefills them from prompt + output at the right seed position."""

from __future__ import annotations

from scheduler_service.allocator import SlotAllocator
from scheduler_service.batch_builder import BatchBuilder
from scheduler_service.config import SchedulerConfig
from scheduler_service.continuations import requeue_running
from scheduler_service.policy import SchedulePolicy
from scheduler_service.prefix_cache import make_prefix_cache
from scheduler_service.request import Phase, Request, SamplingSpec
from scheduler_service.state import SchedState


def _state() -> tuple[SchedState, BatchBuilder]:
    st = SchedState(cache=make_prefix_cache("tree", SlotAllocator(256)), context_length=512)
    return st, BatchBuilder(SchedulerConfig(), st, SchedulePolicy("fcfs"))


def _req(rid: str, prompt: list[int], output: list[int], grammar: bool = False) -> Request:
    return Request(
        rid=rid,
        session="s",
        prompt=prompt,
        spec=SamplingSpec(seed=5, max_new_tokens=20),
        eos_ids=frozenset(),
        output=list(output),
        grammar=("regex", "[a-z]+") if grammar else None,
    )


def test_requeue_frees_everything_and_readmits_with_the_output_offset() -> None:
    st, builder = _state()
    st.grammar_up = True
    reqs = [
        _req("a", [1, 2, 3, 4], [9, 9]),
        _req("b", [1, 2, 3, 5], []),
        _req("c", [7] * 6, [3], True),
    ]
    st.waiting.extend(reqs)
    plan = builder.build()
    assert len(plan.ops.admits) == 3 and len(st.running) == 3
    old_handles = {r.rid: r.handle for r in reqs}
    epochs = [r.epoch for r in reqs]
    st.grammar_ops.clear()  # as if the step's grammar ops had been sent

    back = requeue_running(st)

    assert back == reqs and st.waiting == reqs and not st.running
    for r, e in zip(reqs, epochs, strict=True):
        assert r.phase is Phase.WAITING and r.handle == -1 and r.kv_slots == []
        assert r.node is None and r.match is None and r.epoch == e + 1  # late results dropped
        assert r.fill == r.prompt + r.output
    assert st.cache.free_size == st.cache.allocator.capacity
    st.check_integrity()
    assert st.grammar_ops.releases == [old_handles["c"]]  # the grammar session outlived it

    again = builder.build()  # the model is back
    offsets = {a.handle: a.output_offset for a in again.ops.admits}
    by_rid = {r.rid: r for r in reqs}
    assert {by_rid[rid].handle for rid in "abc"} == set(offsets)
    assert offsets[by_rid["a"].handle] == 2 and offsets[by_rid["c"].handle] == 1
    ids = {a.handle: list(a.input_ids) for a in again.ops.admits}
    assert ids[by_rid["a"].handle] == [1, 2, 3, 4, 9, 9]  # prompt + output re-prefilled
    assert st.grammar_ops.binds[by_rid["c"].handle][2] == [3]  # matcher replays the output
