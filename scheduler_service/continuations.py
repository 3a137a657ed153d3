"""Running requests survive a lost model service as continuations.

The worker's KV pool dies with it, so every running request goes back to the waiting queue
holding its prompt and the output generated so far (`fill` = prompt + output). When the model is
back it is re-prefilled like a retracted request: `Admit.output_offset = len(output)` makes seeded
sampling resume at the right output position (randomness is a pure function of seed and
position) and a constrained request's matcher replays its output when it is bound again. The
front door has already seen exactly `output`: tokens of steps whose results never came back are
simply generated again, so none is duplicated or missing.
"""

from __future__ import annotations

from scheduler_service.request import Request
from scheduler_service.state import SchedState


def requeue_running(st: SchedState) -> list[Request]:
    """Move every running request back to the head of the queue (in admission order) and drop
    all KV state: the cache, handles and pending releases describe a pool that is gone.
    Returns the requeued requests. Afterwards the accounting invariant holds with nothing
    allocated."""
    running = list(st.running.values())
    for r in st.waiting:
        r.match = None  # matches point into the cache about to be reset
    for r in reversed(running):  # each goes to the head of the queue: admission order is kept
        st.requeue(r, insert=False)
        r.forget_jumps()
    st.cache.reset()
    st.handles.reset()
    st.pending_release.clear()
    # st.grammar_ops keeps the releases of the old handles: the grammar session outlived the
    # model, and a reused handle is released before it is bound again (same mask step order).
    return running
