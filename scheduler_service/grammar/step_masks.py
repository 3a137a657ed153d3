"""Grammar masks for a step's constrained rows, fetched from the grammar services (one or
more: `grammar_pool` splits the request by owner and gathers the rows).

Two moments (docs/architecture.md, Step protocol):

- `before_send`: admits/extends that sample (a request's first token, the token after a
  jump-forward). Their grammar state is known when the step is built, so their masks travel
  in the Step.
- `after_send`: decode rows. With overlap the step is built before the previous step's tokens
  are back, so their masks are computed once that result is applied, while the worker already
  runs the step's forward pass (`StepOps.masks_follow`, then a `LateMasks`). Rows that must not
  sample after all (jump-forward, a failed grammar, a request that stopped, its grammar
  service gone) are skipped: the worker drops the decode's KV slot and so do we.

A constrained row is never sampled without its mask.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from radixmesh_wire.mask_rows import EncodedRow
from radixmesh_wire.mask_step_ops import ERROR_COMPILE, MaskStepOutcome, MaskStepPlan
from radixmesh_wire.step_ops import LateMasks
from scheduler_service.config import SchedulerConfig
from scheduler_service.grammar.constrained_rows import (
    constrained_prefills,
    drop_rows,
    strip_constrained,
    undo_decode,
)
from scheduler_service.grammar.pool import Gathered
from scheduler_service.planner.batch_builder import PlannedStep, jump_queued
from scheduler_service.request import Phase, Request
from scheduler_service.state import SchedState
from scheduler_service.status import Status

log = structlog.get_logger(__name__)

Fail = Callable[[Request, Status, str], None]


class MaskService(Protocol):
    """The grammar services as this module needs them (`GrammarPool`): one mask step at a
    time; rows whose service was lost come back in `Gathered.lost`."""

    def connected(self) -> list[str]: ...

    def step(self, plan: MaskStepPlan) -> Awaitable[Gathered]: ...


class StepMasks:
    def __init__(
        self, cfg: SchedulerConfig, st: SchedState, grammar: MaskService, fail: Fail
    ) -> None:
        self.cfg = cfg
        self.st = st
        self.grammar = grammar
        self.fail = fail

    async def _fetch(self, step_id: int, want: list[int], jump: list[int]) -> Gathered:
        """The step's mask rows; the wait counts as mask stall (the slowest service's)."""
        st = self.st
        t0 = time.perf_counter()
        try:
            got = await self.grammar.step(st.grammar_ops.build(step_id, want, jump))
        finally:
            st.stats.mask_wait_seconds += time.perf_counter() - t0
        if got.lost:
            st.grammar_up = bool(self.grammar.connected())
        return got

    def _failed_rows(self, res: MaskStepOutcome) -> dict[int, tuple[Status, str]]:
        failed: dict[int, tuple[Status, str]] = {}
        for err in res.errors:
            r = self.st.running.get(err.handle)
            if r is None:
                continue
            code = Status.INVALID_ARGUMENT if err.code == ERROR_COMPILE else Status.INTERNAL
            log.warning("grammar_row_failed", rid=r.rid, code=err.code)
            log.debug("grammar_row_failed_detail", rid=r.rid, error=err.message)  # user text
            failed[err.handle] = (code, f"grammar: {err.message}")
        return failed

    async def before_send(self, plan: PlannedStep) -> None:
        """Masks of the constrained admits/extends into the unsent step."""
        st = self.st
        want = constrained_prefills(st, plan)
        if not want:  # pending grammar operations go with the next mask request
            return
        if not st.grammar_up:
            strip_constrained(st, plan)
            return
        got = await self._fetch(plan.ops.step_id, want, self._resumed_jumps(plan, want))
        res = got.outcome
        # Rows whose service was lost go back to the queue (re-bound with replay there).
        drop_rows(st, plan, set(got.lost))
        failed = self._failed_rows(res)
        for h, (code, message) in failed.items():
            r = st.running[h]
            drop_rows(st, plan, {h})
            if r in st.waiting:
                st.waiting.remove(r)
            self.fail(r, code, message)
        for h, jump in (res.jumps or {}).items():
            jumper = st.running.get(h)
            if jumper is None or h in failed:
                continue
            drop_rows(st, plan, {h})  # back to the queue, to be prefilled with the jump
            jump_queued(st, jumper, jump)
        masks = plan.ops.masks
        for h, row in res.rows.items():
            if h in st.running:
                masks[h] = row

    def _resumed_jumps(self, plan: PlannedStep, want: list[int]) -> list[int]:
        """Rows of resumed requests (their output so far prefilled as a continuation after a
        model, scheduler or grammar loss) that ask for a jump-forward: had the request kept
        decoding, this position's row would have asked, and a greedy or seeded continuation
        must produce the same tokens as the undisturbed run."""
        if self.cfg.jump_forward != "on":
            return []
        st = self.st
        resumed = {r.handle for r in plan.prefilled if r.output}
        return [
            h
            for h in want
            if h in resumed and st.running[h].no_jump_at != len(st.running[h].output)
        ]

    async def after_send(self, plan: PlannedStep) -> LateMasks:
        """Masks (or skips) for the sent step's constrained decode rows, once every earlier
        step's result is applied."""
        st = self.st
        live: list[int] = []
        skip: set[int] = set()
        for h in plan.late:
            r, epoch = plan.owners[h]
            if r.handle == h and r.epoch == epoch and r.phase is Phase.DECODE:
                live.append(h)
            else:
                skip.add(h)  # stopped or released meanwhile: its slots are already freed
        rows: dict[int, EncodedRow] = {}
        lost = live
        if live and st.grammar_up:
            jump = []
            if self.cfg.jump_forward == "on":
                jump = [h for h in live if st.running[h].no_jump_at != len(st.running[h].output)]
            got = await self._fetch(plan.ops.step_id, live, jump)
            lost = got.lost
            res = got.outcome
            failed = self._failed_rows(res)
            for h, (code, message) in failed.items():
                self.fail(st.running[h], code, message)
            skip |= set(failed)
            jumps = res.jumps
            for h, row in res.rows.items():
                req = st.running.get(h)
                if req is None or h in failed:
                    continue
                if jumps and h in jumps:
                    req.offer_jump(jumps[h])  # applied by the next build
                    undo_decode(st, req)
                    skip.add(h)
                else:
                    rows[h] = row
        for h in lost:  # no grammar service for these: they wait for one (and the replay)
            if (waiting := st.running.get(h)) is not None:
                undo_decode(st, waiting)
        skip.update(lost)
        return LateMasks(plan.ops.step_id, rows, sorted(skip))
