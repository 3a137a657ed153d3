"""Grammar masks for a step's constrained rows, fetched from the grammar service.

Two moments (docs/architecture.md, Step protocol):

- `before_send`: admits/extends that sample (a request's first token, the token after a
  jump-forward). Their grammar state is known when the step is built, so their masks travel
  in the Step.
- `after_send`: decode rows. With overlap the step is built before the previous step's tokens
  are back, so their masks are computed once that result is applied, while the worker already
  runs the step's forward pass (`Step.masks_follow`, then a `StepMasks`). Rows that must not
  sample after all (jump-forward, a failed grammar, a request that stopped, the grammar
  service gone) are skipped: the worker drops the decode's KV slot and so do we.

A constrained row is never sampled without its mask.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import structlog

from radixmesh_wire.packing import pack_i32, unpack_i32
from radixmesh_wire.pb import grammar_pb2, model_pb2
from scheduler_service.batch_builder import PlannedStep
from scheduler_service.config import SchedulerConfig
from scheduler_service.constrained_rows import (
    constrained_prefills,
    drop_rows,
    strip_constrained,
    undo_decode,
)
from scheduler_service.grammar_link import GrammarLink, GrammarUnavailable
from scheduler_service.request import Phase, Request
from scheduler_service.state import SchedState

log = structlog.get_logger(__name__)

Fail = Callable[[Request, grpc.StatusCode, str], None]


class StepMasks:
    def __init__(
        self, cfg: SchedulerConfig, st: SchedState, grammar: GrammarLink, fail: Fail
    ) -> None:
        self.cfg = cfg
        self.st = st
        self.grammar = grammar
        self.fail = fail

    async def _fetch(
        self, step_id: int, want: list[int], jump: list[int]
    ) -> grammar_pb2.MaskStepResult | None:
        st = self.st
        t0 = time.perf_counter()
        try:
            return await self.grammar.step(st.grammar_ops.build(step_id, want, jump))
        except GrammarUnavailable:
            st.grammar_up = False
            return None
        finally:
            st.stats.mask_wait_seconds += time.perf_counter() - t0

    def _failed_rows(
        self, res: grammar_pb2.MaskStepResult
    ) -> dict[int, tuple[grpc.StatusCode, str]]:
        failed: dict[int, tuple[grpc.StatusCode, str]] = {}
        for err in res.errors:
            r = self.st.running.get(err.handle)
            if r is None:
                continue
            code = grpc.StatusCode.INVALID_ARGUMENT if err.code == 3 else grpc.StatusCode.INTERNAL
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
        res = await self._fetch(plan.msg.step_id, want, [])
        if res is None:
            strip_constrained(st, plan)
            return
        for h, (code, message) in self._failed_rows(res).items():
            r = st.running[h]
            drop_rows(st, plan, {h})
            if r in st.waiting:
                st.waiting.remove(r)
            self.fail(r, code, message)
        plan.msg.masks.extend(row for row in res.rows if row.handle in st.running)

    async def after_send(self, plan: PlannedStep) -> model_pb2.StepMasks:
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
        rows: list[grammar_pb2.MaskRow] = []
        res = None
        if live and st.grammar_up:
            jump = []
            if self.cfg.jump_forward == "on":
                jump = [h for h in live if st.running[h].no_jump_at != len(st.running[h].output)]
            res = await self._fetch(plan.msg.step_id, live, jump)
        if res is None:
            for h in live:  # no grammar service: these wait for its return (and the replay)
                undo_decode(st, st.running[h])
            skip.update(live)
        else:
            failed = self._failed_rows(res)
            for h, (code, message) in failed.items():
                self.fail(st.running[h], code, message)
            skip |= set(failed)
            for row in res.rows:
                req = st.running.get(row.handle)
                if req is None or row.handle in failed:
                    continue
                jf = row.jump_forward
                if jf.tokens:
                    req.jump = (jf.rollback, unpack_i32(jf.tokens))  # applied by the next build
                    undo_decode(st, req)
                    skip.add(row.handle)
                else:
                    rows.append(row)
        return model_pb2.StepMasks(
            step_id=plan.msg.step_id, rows=rows, skip_handles=pack_i32(sorted(skip))
        )
