"""Builds one step: decodes for running requests, the next chunk of chunked prefills, and new
admissions in policy order within the token, memory and batch budgets (Algorithm 1).

Admission is `prefill_adder.admit_prefills` (budget: free + evictable - the running batch's
expected future decode, remaining max_new_tokens x a decaying new-token ratio). When decodes
themselves do not fit, running requests are retracted (their KV goes into the prefix cache, so
nothing computed is lost while memory lasts) and they wait again with their tokens so far.

Load-ahead (issue 31): a request admitted while its prefix is loaded from the host tier in the
same step is running (``Phase.LOADING``: handle, locked prefix) but has no row in that step;
from the next step on it is served with the requests mid-prefill, and its first chunk goes out
as its ADMIT (the model service waits for the load before that step's forward pass).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from radixmesh_wire.images import MAX_STEP_PIXEL_BYTES, images_after, pixel_bytes
from radixmesh_wire.step_ops import AdmitOp, ExtendOp, Sampling, StepOps
from scheduler_service.cache.prefix_cache import MatchResult
from scheduler_service.config import SchedulerConfig
from scheduler_service.planner.chunk_budget import ChunkBudget
from scheduler_service.planner.policy import SchedulePolicy
from scheduler_service.planner.prefill_adder import (
    NewTokenRatio,
    admit_prefills,
    decode_reservation,
)
from scheduler_service.planner.retraction import plan_retraction
from scheduler_service.request import Phase, Request
from scheduler_service.state import SchedState


@dataclass
class PlannedStep:
    """A built step: the ops for the model service and what applying its result needs."""

    ops: StepOps
    prefill_only: list[Request] = field(default_factory=list)  # finish after this step
    prefilled: list[Request] = field(default_factory=list)  # computed prompt tokens this step
    retracted: list[Request] = field(default_factory=list)
    # Every row by handle: (request, its epoch when built). Results apply only to that
    # incarnation: a handle may be released and reused while the step is in flight.
    owners: dict[int, tuple[Request, int]] = field(default_factory=dict)
    sampling: list[int] = field(default_factory=list)  # handles of rows that sample
    late: list[int] = field(default_factory=list)  # constrained decode rows: masks follow
    # Admitted loading (no row): (request, epoch). If the step fails, its loads did not run.
    loading: list[tuple[Request, int]] = field(default_factory=list)
    sent_at: float = 0.0  # perf_counter when sent (step round-trip metric)

    @property
    def decoded(self) -> list[int]:
        return self.ops.decode_handles

    @property
    def empty(self) -> bool:
        m = self.ops
        return not (m.admits or m.extends or m.decode_handles)


def _sampling(req: Request) -> Sampling:
    s = req.spec
    return replace(
        s,
        stop_ids=tuple(sorted(req.stop_ids)),
        # the output so far (retraction re-admits with it): penalties must keep counting it
        penalty_history=tuple(req.output) if s.penalized else (),
    )


class BatchBuilder:
    def __init__(
        self,
        cfg: SchedulerConfig,
        state: SchedState,
        policy: SchedulePolicy,
        budget: ChunkBudget | None = None,
    ) -> None:
        self.cfg = cfg
        # The scheduler passes the connected model's device; a bare builder (tests) plans as
        # for a GPU.
        self.budget = budget or ChunkBudget.resolve(
            cfg.chunk_tokens, cfg.decode_chunk_tokens, "cuda"
        )
        self.st = state
        self.policy = policy
        # A ratio set below the usual floor is the floor (0: admission reserves nothing).
        ratio = cfg.new_token_ratio
        self.ratio = NewTokenRatio(init=ratio, minimum=min(ratio, NewTokenRatio.FLOOR))

    def build(self) -> PlannedStep:
        st = self.st
        st.step_id += 1
        plan = PlannedStep(StepOps(step_id=st.step_id, releases=st.pending_release))
        for h in st.pending_release:
            st.handles.give(h)  # safe: the worker releases before it sees a later admit
        st.pending_release = []  # a new list: the plan keeps the old one
        jumped = self._jumps(plan)  # first: jumps free and requeue before others take slots
        self._decodes(plan, skip=jumped)
        self._prefill(plan)
        self._track_samplers(plan)
        # Last: the worker poisons these (NaN-fill debug) before this step writes any slot.
        plan.ops.freed_slots = st.cache.allocator.drain_freed()
        host = getattr(st.cache, "host", None)  # the tree's host tier (issue 31)
        if host is not None:
            # Last too: every save of a slot this step reuses, every load of a prefix it
            # admits, queued in order; the worker issues them before the forward pass (a
            # load runs beside it: its requests were admitted loading and join next step).
            plan.ops.copies = host.take_copies(plan.ops.step_id)
            host.stats.loading_requests = len(plan.loading)  # no scan of the running set
        return plan

    def _track_samplers(self, plan: PlannedStep) -> None:
        """Owners and pending counts of the admits/extends (decodes: done in `_decodes`)."""
        st, m = self.st, plan.ops
        sampling = []
        row_ops: list[AdmitOp | ExtendOp] = [*m.admits, *m.extends]
        for op in row_ops:
            r = st.running[op.handle]
            plan.owners[op.handle] = (r, r.epoch)
            if op.sample:
                r.sampling_sent()
                sampling.append(op.handle)
        plan.sampling = sampling + plan.decoded
        m.masks_follow = bool(plan.late)

    # -- jump-forward (compressed FSM) -----------------------------------------------------
    def _jumps(self, plan: PlannedStep) -> set[int]:
        """Apply pending jump-forwards: cut the request back by the grammar's `rollback`
        tokens (the retokenization boundary), append the forced tokens, and prefill them in one
        extend that also samples the next token (with a mask computed after the jump)."""
        st = self.st
        jumped: set[int] = set()
        for r in [r for r in st.running.values() if r.jump is not None and st.runnable(r)]:
            assert r.jump is not None
            rollback, tokens = r.jump
            new_out = r.jumped_output(rollback, tokens)
            keep = min(r.kv_len, len(r.prompt) + len(r.output) - rollback)
            if keep < r.cached_len:
                # The cut falls in cached (shared) KV: a resumed request whose own output came
                # from the cache. Shared slots cannot be cut, so it goes back to the queue with
                # the jump applied and is admitted again, matching the cache up to the cut: the
                # same tokens as had it never left (decoding on instead would keep the old
                # tokenization, and a greedy run would differ from the undisturbed one).
                r.drop_jump()
                self._requeue_jumped(r, (rollback, tokens))
                continue
            slots = st.cache.alloc(len(r.prompt) + len(new_out) - keep)
            if slots is None:
                continue  # no room this step: decode stays paused, retry next step
            r.drop_jump()
            r.truncate(keep, st.cache)
            kept_out = r.take_jump(rollback, new_out)
            st.grammar_ops.rollback(r.handle, rollback)
            for t in new_out[kept_out:]:
                st.grammar_ops.accept(r.handle, t)
            st.stats.jump_forwards += 1
            st.stats.jump_forward_tokens += len(new_out) - kept_out
            plan.ops.truncates.append((r.handle, keep))
            jumped.add(r.handle)
            if slots:
                plan.ops.extends.append(self._extend_op(plan, r, slots))
        return jumped

    # -- decode ------------------------------------------------------------------------------
    def _decodes(self, plan: PlannedStep, skip: set[int]) -> None:
        st, cache = self.st, self.st.cache
        # Runs over every running request each step: st.runnable() inlined, and the rare
        # conditions (a grammar service down, a jump applied this step) filtered apart.
        ctx, decode = st.context_length, Phase.DECODE
        decoders = [
            r
            for r in st.running.values()
            if r.phase is decode
            and r.jump is None
            # room for one more token after those still in flight
            and len(r.output) + r.pending < r.spec.max_new_tokens
            and len(r.fill) + r.pending < ctx
        ]
        if skip or not st.grammar_up:
            decoders = [
                r for r in decoders if r.handle not in skip and (st.grammar_up or r.grammar is None)
            ]
        if decoders:
            self.ratio.step()
        shortfall = len(decoders) - (cache.free_size + cache.evictable_size)
        if shortfall > 0:
            # A request mid-way through a chunked prefill is a candidate too: otherwise it and
            # one decoder can fill the pool between them and neither can ever move.
            candidates = [
                r
                for r in st.running.values()
                if r.phase is Phase.PREFILL or r.phase is Phase.LOADING or r in decoders
            ]
            victims = plan_retraction(candidates, shortfall)
            for r in victims:
                self._retract(r)
                plan.retracted.append(r)
            if victims:
                self.ratio.on_retract()
            decoders = [r for r in decoders if r.phase is Phase.DECODE]
        got = cache.alloc(len(decoders))  # one call: per-request alloc(1) costs 100x more
        if got is None:  # retraction could not free enough: those without a slot wait a step
            got = cache.alloc(cache.free_size + cache.evictable_size) or []
            decoders = decoders[: len(got)]
        Request.decode_all(decoders, got)
        handles = [r.handle for r in decoders]
        plan.owners.update({r.handle: (r, r.epoch) for r in decoders})
        plan.late.extend([r.handle for r in decoders if r.grammar is not None])
        plan.ops.decode_handles = handles
        plan.ops.decode_slots = got

    def _requeue_jumped(self, r: Request, jump: tuple[int, list[int]]) -> None:
        self.st.requeue(r, insert=True)  # its KV up to the cut is matched again at admission
        jump_queued(self.st, r, jump)

    def _retract(self, r: Request) -> None:
        self.st.requeue(r, insert=True)  # its KV stays in the cache until evicted
        self.st.stats.retractions += 1

    # -- prefill ---------------------------------------------------------------------------
    def _prefill(self, plan: PlannedStep) -> None:
        st, cfg = self.st, self.cfg
        running = list(st.running.values())
        # Requests mid-prefill, oldest admission first (the adder's head is sure of progress).
        # Every step, over every running request: st.runnable() inlined.
        prefill, loading, up = Phase.PREFILL, Phase.LOADING, st.grammar_up
        chunked = [
            r
            for r in running
            if (r.phase is prefill or r.phase is loading) and (up or r.grammar is None)
        ]
        remaining = [len(r.fill) - r.kv_len for r in chunked]
        if not st.waiting and not chunked:
            return
        candidates: list[Request] = []
        if st.waiting and len(running) < cfg.max_running:
            waiting = st.waiting if up else [r for r in st.waiting if r.grammar is None]
            candidates, _deferred = self.policy.schedule(waiting, st.cache)
        if not candidates and not chunked:
            return  # a full batch with a long queue: no admission work this step
        ratio = self.ratio.value
        pp = admit_prefills(
            candidates,
            st.cache,
            chunk_budget=self.budget.for_step(decoding=bool(plan.decoded)),
            max_running=cfg.max_running,
            num_running=len(running),
            reserved_tokens=decode_reservation(running, ratio),
            new_token_ratio=ratio,
            chunked_remaining=remaining,
            payload=_image_payload,
            payload_budget=MAX_STEP_PIXEL_BYTES,
        )
        if chunked and pp.continuation_slots is not None:
            for r, slots in zip(chunked, [pp.continuation_slots, *pp.more_slots], strict=True):
                if not slots:
                    continue
                if r.phase is loading:  # its load ran beside the last step: it joins now
                    r.joined()
                    self._admit_op(plan, r, slots)
                else:
                    plan.ops.extends.append(self._extend_op(plan, r, slots))
        for a in pp.admitted:
            self._start(plan, a.item, a.match, a.new_slots, a.loading)
        if pp.admitted:
            taken = {id(a.item) for a in pp.admitted}
            st.waiting = [r for r in st.waiting if id(r) not in taken]

    def _extend_op(self, plan: PlannedStep, r: Request, slots: list[int]) -> ExtendOp:
        ids = r.fill[r.kv_len : r.kv_len + len(slots)]
        if r.phase is Phase.PREFILL:  # prompt chunks only: jump-forward tails may be cut again
            plan.prefilled.append(r)
        done = r.extend(slots)
        sample = done and r.remaining > 0
        if done and not sample:
            plan.prefill_only.append(r)
        return ExtendOp(r.handle, ids, list(slots), sample)

    def _start(
        self,
        plan: PlannedStep,
        r: Request,
        match: MatchResult,
        slots: list[int],
        loading: bool = False,
    ) -> None:
        """`match.node` is already locked by the adder; `slots` hold the first chunk.
        `loading`: its prefix is loaded in this step; its ADMIT goes out in a later one."""
        st = self.st
        prefix = match.slots
        r.admit(st.handles.take(), match.node, prefix, loading)
        if r.first_cached < 0:
            r.first_cached = len(prefix)
            st.stats.prompt_tokens += len(r.prompt)
            st.stats.cached_prompt_tokens += min(len(prefix), len(r.prompt))
            st.extra(r).cached_tokens = len(prefix)
            if st.on_admit is not None:
                st.on_admit(time.perf_counter() - r.submitted_at)
        st.running[r.handle] = r
        if r.grammar is not None:  # replay: a resumed request's matcher catches up first
            st.grammar_ops.bind(r.handle, r.grammar[0], r.grammar[1], r.output, rid=r.rid)
        if loading:
            plan.loading.append((r, r.epoch))
            host = getattr(st.cache, "host", None)
            if host is not None:
                host.stats.load_waits += 1
            return
        self._admit_op(plan, r, slots)

    def _admit_op(self, plan: PlannedStep, r: Request, slots: list[int]) -> None:
        """The request's ADMIT row: its cached prefix and its first chunk in `slots`."""
        prefix = list(r.kv_slots)  # before the chunk: exactly its cached prefix
        ext = self._extend_op(plan, r, slots)
        plan.ops.admits.append(
            AdmitOp(
                handle=r.handle,
                sampling=_sampling(r),
                output_offset=len(r.output),
                prefix_slots=prefix,
                input_ids=ext.input_ids,
                slots=ext.slots,
                sample=ext.sample,
                rid=r.rid,
                images=images_after(r.images, len(prefix)),
            )
        )


def _image_payload(r: Request, cached: int) -> int:
    """Pixel bytes `r`'s admission carries with `cached` positions in the cache."""
    return pixel_bytes(r.images, cached) if r.images else 0


def jump_queued(st: SchedState, r: Request, jump: tuple[int, list[int]]) -> None:
    """Apply a jump-forward to a request that is back in the queue (its KV and matcher were
    released): only its output changes; the next admission prefills it and replays it into a
    fresh matcher. Like a running request's jump (BatchBuilder._jumps), the position right
    after it does not ask for another."""
    rollback, tokens = jump
    new_out = r.jumped_output(rollback, tokens)
    kept = r.take_jump(rollback, new_out)
    r.mark_no_jump()
    st.stats.jump_forwards += 1
    st.stats.jump_forward_tokens += len(new_out) - kept
