"""A step the model service refused or failed (``StepOutcome.error``): what it takes back.

The worker refuses a step its checks reject before changing anything (``validate_step``), or
fails one mid-way (a crash, masks that never came): then it may have run none, some or all of
the step's host-tier copies, and some rows. So:
- the step's requests fail, alone (``owners``), and so do the requests admitted loading in it
  (``loading``: their prefix's load was one of its copies); the other requests keep running;
- the cache drops every copy that step carried as if none had run (``PrefixCache.undo_copies``:
  dropping a cache copy is always safe, keeping a garbage one is not), and with them what
  later copies made from them; a running request whose cached prefix reads GPU slots such a
  load was to fill (admitted in the next step, already sent with overlap) goes back to the
  queue and recomputes: its step is the one after the failure, so nothing it wrote was used.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from scheduler_service.planner.batch_builder import PlannedStep
from scheduler_service.request import Request
from scheduler_service.state import SchedState
from scheduler_service.status import Status

log = structlog.get_logger(__name__)


def fail_step(
    st: SchedState, plan: PlannedStep, error: str, fail: Callable[[Request, Status, str], None]
) -> None:
    """Apply the failure of ``plan`` (``error``: the worker's message); ``fail`` ends one
    request with a status and message (it releases its KV uncached)."""
    # Masks that never came are a slow grammar service, not a fault of the request.
    code = Status.UNAVAILABLE if error.startswith("MaskTimeout") else Status.INTERNAL
    message = f"model step failed: {error}"
    rids = []
    for h, (r, epoch) in plan.owners.items():
        if r.handle == h and r.epoch == epoch:
            rids.append(r.rid)
            fail(r, code, message)
    for r, epoch in plan.loading:  # its prefix's load was in the failed step: not there
        if r.epoch == epoch and r.handle >= 0:
            rids.append(r.rid)
            fail(r, code, message)
    redo: list[str] = []

    def readers(bad: set[int]) -> None:
        for r in list(st.running.values()):
            if not bad.isdisjoint(r.kv_slots[: r.cached_len]):
                redo.append(r.rid)
                st.requeue(r, insert=False)  # nothing of it was computed from good KV yet

    undone = st.cache.undo_copies(plan.ops.step_id, readers)
    log.error(
        "step_failed",
        step=plan.ops.step_id,
        error=error,
        rids=rids,
        requeued=redo,
        undone_copy_slots=undone,
    )
