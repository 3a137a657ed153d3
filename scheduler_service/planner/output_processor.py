"""Applies a step's results: appends sampled tokens, checks stop criteria, finishes requests
(their KV enters the prefix cache) and records the output in each request's session outbox.

With overlap the next step was already built and sent: a request that stops here has one more
decode in flight, whose token is dropped (its handle or epoch no longer matches) and whose KV
slot `SchedState.release` already freed."""

from __future__ import annotations

from radixmesh_wire.step_ops import StepOutcome
from scheduler_service.planner.batch_builder import PlannedStep
from scheduler_service.request import Phase, Request
from scheduler_service.state import SchedState


def finish(st: SchedState, r: Request, reason: str, stop_token: int = -1) -> None:
    ex = st.extra(r)
    ex.finish = reason
    ex.matched_stop_token = stop_token
    st.release(r, insert=True)
    st.stats.finished_requests += 1


def _current(plan: PlannedStep, handle: int) -> Request | None:
    """The request this step sampled for under `handle`, if it is still that incarnation."""
    entry = plan.owners.get(handle)
    if entry is None:
        return None
    r, epoch = entry
    return r if r.handle == handle and r.epoch == epoch else None


def apply_result(st: SchedState, plan: PlannedStep, res: StepOutcome) -> None:
    handles = res.handles
    for p in res.prompt_logprobs:
        r = _current(plan, p.handle)
        if r is not None and p.values:
            start = p.start
            st.extra(r).prompt_logprobs.extend(
                (r.fill[start + i], v) for i, v in enumerate(p.values)
            )
    for r in plan.prefilled:
        if r.handle >= 0 and r.node is not None:
            # Cache the computed prompt now, not at finish: requests deferred by in-batch prefix
            # sharing (and later chunks) hit it next round. A resumed constrained request's
            # output stays its own: a jump-forward may cut it again, and cached KV cannot be cut.
            n = r.known_kv if r.grammar is None else min(r.known_kv, len(r.prompt))
            if n <= r.cached_len:
                continue  # nothing new (and the cache's part never shrinks)
            cached = st.cache.cache_unfinished(r.cache_keys(n), r.kv_slots[:n], r.node)
            if cached is not None:
                r.cached_prefix(cached.node, cached.cached_len)
    _apply_tokens(st, plan, res)
    if len(handles) != len(plan.sampling):  # rows skipped by late masks, or a failed step
        got = set(handles)
        for h in plan.sampling:
            if h not in got and (r := _current(plan, h)) is not None:
                r.sample_settled()
    for r in plan.prefill_only:
        if r.handle >= 0:
            finish(st, r, "length")


def _apply_tokens(st: SchedState, plan: PlannedStep, res: StepOutcome) -> None:
    """Each sampled row's token to its request: once per running request per step, so the
    per-row work is inlined (`_current`, the token's bookkeeping) and attribute lookups are
    kept to the minimum; the rare paths (stop, grammar, logprobs, the end) stay calls."""
    owners, top, ctx = plan.owners, res.top, st.context_length
    decode = Phase.DECODE
    generated = 0
    for h, tok, lp in zip(res.handles, res.tokens, res.logprobs, strict=True):
        entry = owners.get(h)
        if entry is None:
            continue
        r, epoch = entry
        if r.handle != h or r.epoch != epoch:
            continue  # released (aborted, retracted, stopped) while the step ran
        r.sample_settled()
        if r.phase is not decode:
            continue
        generated += 1
        if tok in r.stop_ids:
            finish(st, r, "stop", tok)  # the stop token itself is not part of the output
            continue
        out, fill = r.output, r.fill
        out.append(tok)
        fill.append(tok)
        box = r.outbox  # two appends, no object per request
        box.keys.append(r.key)
        box.events.append(tok)
        if r.grammar is not None:
            st.grammar_ops.accept(h, tok)
        if r.wants_logprobs:
            _logprobs(st, r, tok, lp, top.get(h) if top else None)
        if len(out) >= r.spec.max_new_tokens or len(fill) >= ctx:
            finish(st, r, "length")
    st.stats.generated_tokens += generated


def _logprobs(
    st: SchedState, r: Request, tok: int, lp: float, top: tuple[list[int], list[float]] | None
) -> None:
    top_ids, top_lps = top if top is not None else ([], [])
    st.extra(r).logprobs.append((tok, lp, top_ids, top_lps))
