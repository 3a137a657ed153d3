"""Executes one step exactly as the scheduler wrote it (no policy choices here).

Per-session request state lives here under the scheduler's integer handles: the KV slots of
the sequence so far, the sampling parameters and how many tokens were sampled (the seed
position). The last sampled token of every request stays on the device (`last_tokens[handle]`)
and the next DECODE reads it there, so the scheduler never sends it back and step N+1 can be
launched before step N's tokens reach the host. Invariant per request: len(slots) == tokens
whose KV is (or, once queued work has run, will be) in the pool.

A step runs in two halves (`launch`, then `finish`): `launch` queues all of the step's GPU work
and returns at once; `finish` waits for it and reads the tokens back. The server launches N+1
before finishing N, so the host work of N+1 hides behind N's kernels. Grammar masks may come
after the step (`masks_follow`): `launch` queues the forward pass, then waits for the masks
(`mask_source`) while the GPU computes, and only then samples.

The state types live in `runner_state.py`; `InFlight`, `RequestState` and `StepError` are
imported from here too (server, tensor-parallel ranks, tests).
"""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np
import structlog
import torch

from model_service.attention.backend import AttentionBackend, RowPlan
from model_service.cuda_graphs import DecodeCudaGraphs
from model_service.image_rows import RequestImages, RowSpan, step_image_rows
from model_service.kv_pool import KVPool
from model_service.models.llama import LlamaForCausalLM
from model_service.penalty_rows import build_penalties, count_sampled
from model_service.runner_state import InFlight, MaskSource, RequestState, StepError, StepRow
from model_service.sampling import SamplingBatch, SamplingFlags, sample
from model_service.slot_seq import SlotSeq
from model_service.step_bursts import BURST_IDLE_S as BURST_IDLE_S  # re-exported (load test)
from model_service.step_bursts import StepBursts
from model_service.step_inputs import StepLayout, stage_inputs
from model_service.step_logits import apply_masks, ban_stops, prompt_logprobs
from model_service.step_validation import rows_touching_loads
from model_service.transfer import HostStager, to_device, to_host
from radixmesh_wire.mask_rows import EncodedRow
from radixmesh_wire.step_ops import RowOutput, StepOps, StepOutput

log = structlog.get_logger(__name__)


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        pool: KVPool,
        attention: AttentionBackend,
        device: torch.device,
        decode_graphs: DecodeCudaGraphs | None = None,
    ) -> None:
        self.model = model
        self.pool = pool
        self.attn = attention
        self.device = device
        self.decode_graphs = decode_graphs  # replays decode-only steps that fit a bucket
        self.requests: dict[int, RequestState] = {}
        self.last_tokens = torch.zeros(256, dtype=torch.int64, device=device)  # by handle
        self.mask_source: MaskSource | None = None  # set by the server for masks_follow steps
        self.cuda = device.type == "cuda"
        self.bursts = StepBursts()  # per-burst step figures, logged as step_burst lines
        self.stager = HostStager(device)  # the step's small inputs: one pinned copy per batch

    def reset(self) -> None:
        self.requests.clear()

    @torch.inference_mode()
    def step(self, ops: StepOps) -> StepOutput:
        """One step start to end (in-process callers; the server pipelines the halves)."""
        return self.finish(self.launch(ops))

    # -- first half: queue the work ------------------------------------------------------------
    @torch.inference_mode()
    def launch(self, ops: StepOps) -> InFlight:
        t0 = time.perf_counter()
        fl = InFlight(ops.step_id, t0)
        for handle in ops.releases:  # first: a released handle may be re-admitted this step
            self.requests.pop(handle, None)
        # Host tier, load-ahead: first the compute stream waits for the loads of earlier
        # steps (this step may read or reuse their slots), then this step's copies in order,
        # before its slots are poisoned or reused. Its own loads overlap its forward pass and
        # are waited for next step, unless a row of it touches their slots (a scheduler
        # without load-ahead sends that): then its forward pass waits for them, as before.
        self.pool.wait_loads()
        if self.pool.copy_stats.in_flight:  # copy times that completed since (never waits)
            self.pool.copy_stats.poll()
        if ops.copies:
            touching = rows_touching_loads(ops, self.requests, self.pool.k.shape[1])
            if touching is not None:
                self.pool.copy_stats.same_step_waits += 1
                log.info("loads_waited_in_their_step", step=ops.step_id, first_row=touching)
            for c in ops.copies:
                self.pool.copy(c.to_host, c.src, c.dst, ahead=touching is None)
        if ops.freed_slots:
            freed = ops.freed_slots
            if ops.copies:  # a slot freed and then loaded into in this step holds good KV
                loaded = {s for c in ops.copies if not c.to_host for s in c.dst}
                freed = [s for s in freed if s not in loaded]
            self.pool.poison(to_device(freed, torch.int64, self.device))
        for handle, length in ops.truncates:
            st = self._get(handle)
            st.slots.truncate(length)
            st.has_token = False
        rows = self._collect_rows(ops)
        if rows:
            self._run(rows, ops, fl)
        if self.cuda:
            fl.done = torch.cuda.Event(enable_timing=True)
            fl.done.record()
        return fl

    def _get(self, handle: int) -> RequestState:
        st = self.requests.get(handle)
        if st is None:
            raise StepError(f"unknown request handle {handle}")
        return st

    def _collect_rows(self, ops: StepOps) -> list[StepRow]:
        rows: list[StepRow] = []
        for a in ops.admits:
            if a.handle in self.requests:
                raise StepError(f"handle {a.handle} admitted twice")
            st = RequestState(a.sampling, SlotSeq(a.prefix_slots), a.output_offset)
            if a.images:
                st.images = RequestImages(a.images)
            self.requests[a.handle] = st
            rows.append(StepRow(a.handle, st, a.input_ids, a.slots, a.sample))
        for e in ops.extends:
            rows.append(StepRow(e.handle, self._get(e.handle), e.input_ids, e.slots, e.sample))
        for handle, slot in zip(ops.decode_handles, ops.decode_slots, strict=True):
            st = self._get(handle)
            if not st.has_token:
                raise StepError(f"decode for handle {handle} with no sampled token")
            rows.append(StepRow(handle, st, None, [slot], True))
        for r in rows:
            if r.input_ids is not None and (len(r.input_ids) != r.n or not r.input_ids):
                raise StepError(f"handle {r.handle}: {len(r.input_ids)} ids for {r.n} slots")
        return rows

    def _run(self, rows: list[StepRow], ops: StepOps, fl: InFlight) -> None:
        dev = self.device
        lay = _lay_out(rows)  # host side: slots extended, positions, logit rows
        logit_rows, cursor = lay.logit_rows, lay.tokens
        staged = stage_inputs(self.stager, self.last_tokens, rows, lay)
        ids, kv_flat = staged.ids, staged.kv_flat
        plans = [
            RowPlan(r.n, kv) for r, kv in zip(rows, torch.split(kv_flat, lay.kv_lens), strict=True)
        ]
        if self.cuda:
            fl.gpu_start = torch.cuda.Event(enable_timing=True)
        logits = None
        if (
            self.decode_graphs is not None
            and cursor == len(rows)
            and logit_rows == list(range(cursor))
        ):
            logits = self.decode_graphs.run(
                ids, staged.pos, staged.out_slots, plans, fl.gpu_start, kv_flat
            )
            fl.graphed = logits is not None
        fl.tokens_in = cursor
        if logits is None:
            self.attn.plan(plans, staged.out_slots, kv_flat)
            if fl.gpu_start is not None:
                fl.gpu_start.record()
            # Image positions take the vision tower's features (only multimodal models
            # admit requests with images: step_validation).
            images = (
                step_image_rows(cast(Any, self.model), lay.image_spans, dev)
                if lay.image_spans
                else None
            )
            extra = {"images": images} if images is not None else {}
            logits = self.model(
                ids,
                staged.pos,
                self.attn,
                staged.logit_rows,
                **extra,
            )
        fl.prompt_lps = prompt_logprobs(rows, lay.lp_spans, logits)
        if ops.masks_follow and self.cuda:
            fl.fwd_done = torch.cuda.Event(enable_timing=True)
            fl.fwd_done.record()
        t_wait = time.perf_counter()
        masks, skip = self._masks_for(ops)
        if ops.masks_follow:
            fl.mask_wait_s = time.perf_counter() - t_wait
            if fl.fwd_done is not None:
                fl.sample_start = torch.cuda.Event(enable_timing=True)
                fl.sample_start.record()
        self._sample(rows, lay.sample_rows, logits, masks, skip, fl)

    def _masks_for(self, ops: StepOps) -> tuple[dict[int, EncodedRow], set[int]]:
        if not ops.masks_follow:
            return ops.masks, set()
        if self.mask_source is None:
            raise StepError("a masks_follow step, but this worker has no mask source")
        masks, skip = self.mask_source(ops.step_id)  # blocks while the forward pass runs
        return {**ops.masks, **masks}, skip

    def _undo_decode(self, r: StepRow) -> None:
        """A skipped row (its grammar jumps forward, failed, or the request ended): drop the
        slot its decode just wrote; its last token stays the input of its next decode."""
        if r.input_ids is not None:
            raise StepError(f"handle {r.handle}: only decode rows can be skipped")
        r.state.slots.pop()

    def _sample(
        self,
        rows: list[StepRow],
        sample_rows: list[int],
        logits: torch.Tensor,
        masks: dict[int, EncodedRow],
        skip: set[int],
        fl: InFlight,
    ) -> None:
        sampled: list[StepRow] = []
        keep: list[int] = []
        for r, lrow in zip((r for r in rows if r.sample), sample_rows, strict=True):
            if r.handle in skip:
                self._undo_decode(r)
            else:
                sampled.append(r)
                keep.append(lrow)
        if not sampled:
            return
        dev = logits.device
        sp = [r.state.sampling for r in sampled]
        handles = [r.handle for r in sampled]
        temp = [s.temperature for s in sp]
        top_p = [s.top_p for s in sp]
        top_k = [s.top_k for s in sp]
        min_p = [s.min_p for s in sp]
        i64, f32 = torch.int64, torch.float32
        keep_t, temp_t, top_p_t, top_k_t, min_p_t, seeds_t, pos_t, handles_t = self.stager.send(
            [
                (keep, i64),
                (temp, f32),
                (top_p, f32),
                (top_k, i64),
                (min_p, f32),
                ([s.seed & 0x7FFFFFFFFFFFFFFF for s in sp], i64),
                ([r.state.sampled for r in sampled], i64),
                (handles, i64),
            ]
        )
        lg = logits.index_select(0, keep_t)
        if masks:
            apply_masks(sampled, lg, masks)
        ban_stops(sampled, lg, bool(masks))
        pen_rows = [(r.state.sampling, r.state.counts) for r in sampled]
        params = SamplingBatch(
            temperature=temp_t,
            top_p=top_p_t,
            top_k=top_k_t,
            min_p=min_p_t,
            seeds=seeds_t,
            positions=pos_t,
            flags=SamplingFlags.of(temp, top_k, top_p, min_p),
            penalties=build_penalties(pen_rows, lg.shape[-1], dev),
        )
        k = max(s.top_logprobs for s in sp)
        tokens, chosen, top_ids, top_vals = sample(lg, params, k)
        count_sampled(pen_rows, tokens)
        if max(handles) >= self.last_tokens.numel():
            grown = torch.zeros(2 * max(handles) + 1, dtype=torch.int64, device=dev)
            grown[: self.last_tokens.numel()] = self.last_tokens
            self.last_tokens = grown
        self.last_tokens.index_copy_(0, handles_t, tokens)
        for r in sampled:
            st = r.state
            st.has_token = True
            st.sampled += 1
            st.in_prompt = False
            st.pending_lp = None
        fl.handles = handles
        fl.top_n = [s.top_logprobs for s in sp]
        fl.tokens, fl.logprobs = to_host(tokens), to_host(chosen)
        if top_ids is not None and top_vals is not None:
            fl.top_ids, fl.top_vals = to_host(top_ids), to_host(top_vals)

    # -- second half: wait and read back -------------------------------------------------------
    def finish(self, fl: InFlight) -> StepOutput:
        """Wait for a launched step and build its output. Touches no request state, so it
        may run on another thread while the next step is being launched."""
        if fl.done is not None:
            fl.done.synchronize()
        out: list[RowOutput] = []
        if fl.handles:
            assert fl.tokens is not None and fl.logprobs is not None
            toks, lps = fl.tokens.tolist(), fl.logprobs.tolist()
            tid = fl.top_ids.tolist() if fl.top_ids is not None else None
            tvl = fl.top_vals.tolist() if fl.top_vals is not None else None
            for i, h in enumerate(fl.handles):
                row = RowOutput(h, toks[i], lps[i])
                n = fl.top_n[i]
                if n and tid is not None and tvl is not None:
                    row.top_ids, row.top_logprobs = tid[i][:n], tvl[i][:n]
                out.append(row)
        t1 = time.perf_counter()
        self.bursts.account(fl, t1)
        return StepOutput(fl.step_id, out, fl.prompt_lps, (t1 - fl.t0) * 1e3)


def _lay_out(rows: list[StepRow]) -> StepLayout:
    """The step's host-side walk over its rows, in row order: extends each row's slots (its KV
    is queued by this step) and sets each sampled row's seed position."""
    pos: list[int] = []
    out_slots: list[int] = []
    kv_views: list[np.ndarray] = []
    kv_lens: list[int] = []
    logit_rows: list[int] = []
    # per row: (first logit row index, first absolute position with logits) for prompt lp
    lp_spans: list[tuple[int, int, int] | None] = []
    sample_rows: list[int] = []
    image_spans: list[RowSpan] = []
    cursor = 0
    for r in rows:
        st, n = r.state, r.n
        start = len(st.slots)
        if st.images is not None and r.input_ids is not None:
            image_spans.append(RowSpan(st.images, start, n, cursor))
        st.slots.extend(r.new_slots)
        pos.extend(range(start, start + n))
        out_slots.extend(r.new_slots)
        kv_views.append(st.slots.view())
        kv_lens.append(len(st.slots))
        p = st.sampling.prompt_logprobs_from
        span = None
        if st.in_prompt and p >= 0:
            # logits at position i score token i + 1; we need tokens from max(p, 1) on
            first = max(start, p - 1, 0)
            if first < start + n:
                span = (len(logit_rows), first, start + n)
                logit_rows.extend(range(cursor + first - start, cursor + n))
        lp_spans.append(span)
        if r.sample:
            # Output length at this draw: the sequence (whose KV is now queued) minus the
            # prompt. A jump-forward truncates and extends the sequence by whole tokens.
            if st.prompt_len < 0:
                st.prompt_len = len(st.slots) - st.sampled
            st.sampled = len(st.slots) - st.prompt_len
            last = cursor + n - 1
            if span is not None:
                sample_rows.append(span[0] + (span[2] - span[1]) - 1)
            else:
                sample_rows.append(len(logit_rows))
                logit_rows.append(last)
        cursor += n
    return StepLayout(
        pos, out_slots, kv_views, kv_lens, logit_rows, lp_spans, sample_rows, image_spans, cursor
    )
