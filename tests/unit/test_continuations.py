"""Model lost: running requests go back to the queue as continuations with nothing allocated,
and the next model session re-prefills them from prompt + output at the right seed position."""

from __future__ import annotations

from radixmesh_wire.step_ops import StepOutcome
from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.prefix_cache import make_prefix_cache
from scheduler_service.config import SchedulerConfig
from scheduler_service.continuations import requeue_running
from scheduler_service.planner.batch_builder import BatchBuilder, PlannedStep
from scheduler_service.planner.output_processor import apply_result
from scheduler_service.planner.policy import SchedulePolicy
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


def _resumed(st: SchedState, builder: BatchBuilder) -> tuple[Request, PlannedStep]:
    """A constrained request resumed with output [20..25] (a lost grammar service or model),
    admitted: its prompt + output are prefilled and its next token sampled."""
    st.grammar_up = True
    r = _req("c", [7] * 6, [20, 21, 22, 23, 24, 25], grammar=True)
    st.waiting.append(r)
    plan = builder.build()
    assert [list(a.input_ids) for a in plan.ops.admits] == [r.prompt + r.output]
    return r, plan


def test_a_resumed_constrained_request_caches_its_prompt_only() -> None:
    """Its output may still be cut by a jump-forward, and cached (shared) KV cannot be cut."""
    st, builder = _state()
    r, plan = _resumed(st, builder)
    apply_result(st, plan, StepOutcome(plan.ops.step_id, [r.handle], [26], [0.0]))
    assert r.output == [20, 21, 22, 23, 24, 25, 26]
    assert r.cached_len == len(r.prompt)
    st.check_integrity()


def test_a_jump_into_cached_output_is_redone_from_the_queue() -> None:
    """A retracted constrained request comes back with its output in the cache. A jump-forward
    that rewrites its last three output tokens cannot cut that shared KV: the request goes back to
    the queue with the jump applied and the next admission matches the cache up to the cut, so
    the tokens are those of a run that never left."""
    st, builder = _state()
    r, plan = _resumed(st, builder)
    apply_result(st, plan, StepOutcome(plan.ops.step_id, [r.handle], [26], [0.0]))
    builder._retract(r)  # memory pressure: its prompt + output enter the cache
    again = builder.build()
    assert r.cached_len == len(r.prompt) + 6  # the output came from the cache
    assert [list(a.input_ids) for a in again.ops.admits] == [[26]]
    apply_result(st, again, StepOutcome(again.ops.step_id, [r.handle], [27], [0.0]))
    forwards = st.stats.jump_forwards

    r.jump = (3, [40, 41, 42])  # the grammar's retokenized forced text, replacing [25, 26, 27]
    old_handle = r.handle
    cut = builder.build()

    assert r.output == [20, 21, 22, 23, 24, 40, 41, 42]
    assert r.no_jump_at == len(r.output) and st.stats.jump_forwards == forwards + 1
    assert not cut.ops.truncates and st.pending_release == [old_handle]
    (admit,) = cut.ops.admits  # back at the head of the queue: admitted in the same step
    assert admit.handle == r.handle != old_handle and admit.output_offset == len(r.output)
    assert list(admit.input_ids) == [40, 41, 42]  # matched the cache up to the cut
    assert st.grammar_ops.binds[r.handle][2] == r.output  # the matcher replays the new output
    st.check_integrity()
