"""Which rows of a planned step are constrained samplers, taking rows back out of a step before
it is sent (grammar service lost, or a row's grammar failed), and undoing a sent decode whose
row the worker is told to skip."""

from __future__ import annotations

from scheduler_service.planner.batch_builder import PlannedStep
from scheduler_service.request import Request
from scheduler_service.state import SchedState


def constrained_prefills(st: SchedState, plan: PlannedStep) -> list[int]:
    """Handles of constrained admits/extends that sample in this step: their masks go with the
    step (decode rows' masks follow it: `PlannedStep.late`)."""
    m = plan.ops
    want = [a.handle for a in m.admits if a.sample and _constrained(st, a.handle)]
    want += [e.handle for e in m.extends if e.sample and _constrained(st, e.handle)]
    return want


def undo_decode(st: SchedState, r: Request) -> None:
    """The worker skips this request's decode in a sent step (LateMasks.skip) and
    drops the slot it wrote: give the slot back, so the request is as if never decoded."""
    r.undo_decode(st.cache)


def _constrained(st: SchedState, handle: int) -> bool:
    r = st.running.get(handle)
    return r is not None and r.grammar is not None


def strip_constrained(st: SchedState, plan: PlannedStep) -> None:
    drop_rows(st, plan, set(constrained_prefills(st, plan)))


def drop_rows(st: SchedState, plan: PlannedStep, handles: set[int]) -> None:
    """Remove these handles' work from the unsent step, undoing the builder's bookkeeping:
    a decode gives its new slot back; a prefill request goes back to the queue (its computed
    prefix stays cached, so the retry is cheap)."""
    if not handles:
        return
    m = plan.ops
    dh, ds = m.decode_handles, m.decode_slots
    keep = [(h, s) for h, s in zip(dh, ds, strict=True) if h not in handles]
    for h in dh:
        if h in handles and (r := st.running.get(h)) is not None:
            undo_decode(st, r)
            r.sample_settled()
    plan.late = [h for h in plan.late if h not in handles]
    plan.sampling = [h for h in plan.sampling if h not in handles]
    m.masks_follow = bool(plan.late)
    m.decode_handles = [h for h, _ in keep]  # also `plan.decoded`
    m.decode_slots = [s for _, s in keep]
    dropped = [op.handle for op in m.admits if op.handle in handles]
    dropped += [op.handle for op in m.extends if op.handle in handles]
    m.admits = [op for op in m.admits if op.handle not in handles]
    m.extends = [op for op in m.extends if op.handle not in handles]
    for h in dropped:
        r = st.running.get(h)
        if r is not None:
            _requeue(st, plan, r)


def _requeue(st: SchedState, plan: PlannedStep, r: Request) -> None:
    """Back to the queue. Its slots (earlier chunks included) are freed: simpler than keeping
    a partial prefill alive, and rare (only when the grammar service goes away)."""
    for lst in (plan.prefilled, plan.prefill_only):
        if r in lst:
            lst.remove(r)
    st.requeue(r, insert=False)
