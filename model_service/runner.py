"""Executes one step exactly as the scheduler wrote it (no policy choices here).

Per-session request state lives here under the scheduler's integer handles: the KV slots of
the sequence so far, the sampling parameters, how many tokens were sampled (the seed position)
and the last sampled token, which the next DECODE consumes (so the scheduler never needs to
send it back). Invariant per request: len(slots) == tokens whose KV is in the pool.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog
import torch

from grammar_service.mask_packing import EncodedRow, MaskEncoding, bitmask_to_bool, decode_rows
from model_service.attention.reference import ReferenceAttention, RowPlan
from model_service.cuda_graphs import DecodeCudaGraphs
from model_service.kv_pool import KVPool
from model_service.models.llama import LlamaForCausalLM
from model_service.sampling import SamplingBatch, sample
from model_service.step_ops import (
    PromptLogprobs,
    RowOutput,
    Sampling,
    StepOps,
    StepOutput,
)

log = structlog.get_logger(__name__)

BURST_IDLE_S = 0.5  # a pause this long between steps ends a burst (see ModelRunner._account)


class StepError(Exception):
    """The step is inconsistent with the worker's state (a scheduler bug, never user input)."""


@dataclass
class RequestState:
    sampling: Sampling
    slots: list[int]
    sampled: int  # output tokens drawn so far, including those before a resubmission
    last_token: int | None = None
    in_prompt: bool = True
    pending_lp: torch.Tensor | None = None  # log-softmax of the last prompt position


@dataclass
class _Row:
    handle: int
    state: RequestState
    input_ids: list[int]
    new_slots: list[int]
    sample: bool


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, pool: KVPool, attention: ReferenceAttention,
                 device: torch.device, decode_graphs: DecodeCudaGraphs | None = None) -> None:
        self.model = model
        self.pool = pool
        self.attn = attention
        self.device = device
        self.decode_graphs = decode_graphs  # replays decode-only steps that fit a bucket
        self.requests: dict[int, RequestState] = {}
        self.masks: dict[int, tuple[int, bytes]] = {}
        # Burst accounting: [steps, seconds inside step(), seconds between steps]
        self._burst = [0, 0.0, 0.0]
        self._last_end: float | None = None

    def reset(self) -> None:
        self.requests.clear()

    @torch.inference_mode()
    def step(self, ops: StepOps) -> StepOutput:
        t0 = time.perf_counter()
        for handle in ops.releases:  # first: a released handle may be re-admitted this step
            self.requests.pop(handle, None)
        if ops.freed_slots:
            self.pool.poison(torch.tensor(ops.freed_slots, device=self.device))
        for handle, length in ops.truncates:
            st = self._get(handle)
            del st.slots[length:]
            st.last_token = None
        rows = self._collect_rows(ops)
        self.masks = ops.masks
        outputs, plps = self._run(rows) if rows else ([], [])
        t1 = time.perf_counter()
        self._account(t0, t1)
        return StepOutput(ops.step_id, outputs, plps, (t1 - t0) * 1e3)

    def _account(self, t0: float, t1: float) -> None:
        """Time inside step() (which ends after the GPU is done: sampling reads the tokens
        back) vs time between steps (the worker waits on the scheduler and transport, the GPU
        idles). Logged once per burst of steps, when a pause over BURST_IDLE_S ends it."""
        b = self._burst
        if self._last_end is not None:
            gap = t0 - self._last_end
            if gap > BURST_IDLE_S:
                self.log_burst()
            else:
                b[2] += gap
        b[0] += 1
        b[1] += t1 - t0
        self._last_end = t1

    def log_burst(self) -> None:
        steps, busy, gap = self._burst
        if steps >= 2:
            log.info("step_burst", steps=steps, busy_ms=round(busy * 1e3, 2),
                     between_ms=round(gap * 1e3, 2),
                     busy_ms_per_step=round(busy * 1e3 / steps, 3),
                     between_ms_per_step=round(gap * 1e3 / (steps - 1), 3))
        self._burst = [0, 0.0, 0.0]

    def _get(self, handle: int) -> RequestState:
        st = self.requests.get(handle)
        if st is None:
            raise StepError(f"unknown request handle {handle}")
        return st

    def _collect_rows(self, ops: StepOps) -> list[_Row]:
        rows: list[_Row] = []
        for a in ops.admits:
            if a.handle in self.requests:
                raise StepError(f"handle {a.handle} admitted twice")
            st = RequestState(a.sampling, list(a.prefix_slots), a.output_offset)
            self.requests[a.handle] = st
            rows.append(_Row(a.handle, st, a.input_ids, a.slots, a.sample))
        for e in ops.extends:
            rows.append(_Row(e.handle, self._get(e.handle), e.input_ids, e.slots, e.sample))
        for handle, slot in zip(ops.decode_handles, ops.decode_slots, strict=True):
            st = self._get(handle)
            if st.last_token is None:
                raise StepError(f"decode for handle {handle} with no sampled token")
            rows.append(_Row(handle, st, [st.last_token], [slot], True))
        for r in rows:
            if len(r.input_ids) != len(r.new_slots) or not r.input_ids:
                raise StepError(f"handle {r.handle}: {len(r.input_ids)} ids for "
                                f"{len(r.new_slots)} slots")
        return rows

    def _run(self, rows: list[_Row]) -> tuple[list[RowOutput], list[PromptLogprobs]]:
        dev = self.device
        ids: list[int] = []
        pos: list[int] = []
        out_slots: list[int] = []
        plans: list[RowPlan] = []
        logit_rows: list[int] = []
        # per row: (first logit row index, first absolute position with logits) for prompt lp
        lp_spans: list[tuple[int, int, int] | None] = []
        sample_rows: list[int] = []
        cursor = 0
        for r in rows:
            st, n = r.state, len(r.input_ids)
            start = len(st.slots)
            st.slots.extend(r.new_slots)
            ids.extend(r.input_ids)
            pos.extend(range(start, start + n))
            out_slots.extend(r.new_slots)
            plans.append(RowPlan(n, torch.tensor(st.slots, dtype=torch.int64, device=dev)))
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
                last = cursor + n - 1
                if span is not None:
                    sample_rows.append(span[0] + (span[2] - span[1]) - 1)
                else:
                    sample_rows.append(len(logit_rows))
                    logit_rows.append(last)
            cursor += n
        logits = None
        if (self.decode_graphs is not None and cursor == len(rows)
                and logit_rows == list(range(cursor))):
            logits = self.decode_graphs.run(ids, pos, out_slots, plans)
        if logits is None:
            self.attn.plan(plans, torch.tensor(out_slots, dtype=torch.int64, device=dev))
            i64 = torch.int64
            logits = self.model(torch.tensor(ids, dtype=i64, device=dev),
                                torch.tensor(pos, dtype=i64, device=dev), self.attn,
                                torch.tensor(logit_rows, dtype=i64, device=dev))
        plps = self._prompt_logprobs(rows, lp_spans, logits)
        return self._sample(rows, sample_rows, logits), plps

    def _prompt_logprobs(self, rows: list[_Row], spans: list[tuple[int, int, int] | None],
                         logits: torch.Tensor) -> list[PromptLogprobs]:
        out: list[PromptLogprobs] = []
        for r, span in zip(rows, spans, strict=True):
            if span is None:
                continue
            st = r.state
            row0, first, end = span
            lp = torch.log_softmax(logits[row0 : row0 + end - first], dim=-1)
            start = end - len(r.input_ids)
            values: list[float] = []
            abs_start = first + 1
            p = st.sampling.prompt_logprobs_from
            if st.pending_lp is not None and start >= max(p, 1):
                values.append(float(st.pending_lp[r.input_ids[0]]))  # across a chunk boundary
                abs_start = start
            # logits at absolute i (first..end-2) score the token at i + 1 in this chunk
            nxt = torch.tensor(r.input_ids[first + 1 - start :], dtype=torch.int64,
                               device=lp.device)
            if nxt.numel():
                values.extend(lp[: nxt.numel()].gather(1, nxt[:, None]).squeeze(1).tolist())
            st.pending_lp = lp[-1] if not r.sample else None
            if values:
                out.append(PromptLogprobs(r.handle, abs_start, values))
        return out

    def _apply_masks(self, sampled: list[_Row], lg: torch.Tensor) -> None:
        """Grammar masks: disallowed tokens get -inf before any sampling (never unmasked)."""
        idx = [i for i, r in enumerate(sampled) if r.handle in self.masks]
        if not idx:
            return
        rows = [EncodedRow(MaskEncoding(e), d)
                for e, d in (self.masks[sampled[i].handle] for i in idx)]
        width = lg.shape[-1]
        words = decode_rows(rows, width).to(lg.device)
        allowed = bitmask_to_bool(words, width)
        sel = torch.tensor(idx, dtype=torch.int64, device=lg.device)
        lg[sel] = lg[sel].masked_fill(~allowed, float("-inf"))

    def _sample(self, rows: list[_Row], sample_rows: list[int], logits: torch.Tensor
                ) -> list[RowOutput]:
        sampled = [r for r in rows if r.sample]
        if not sampled:
            return []
        dev = logits.device
        lg = logits.index_select(0, torch.tensor(sample_rows, dtype=torch.int64, device=dev))
        sp = [r.state.sampling for r in sampled]
        for i, r in enumerate(sampled):
            if r.state.sampled < r.state.sampling.min_new_tokens and r.state.sampling.stop_ids:
                lg[i, list(r.state.sampling.stop_ids)] = float("-inf")
        if self.masks:
            self._apply_masks(sampled, lg)
        params = SamplingBatch(
            temperature=torch.tensor([s.temperature for s in sp], device=dev),
            top_p=torch.tensor([s.top_p for s in sp], device=dev),
            top_k=torch.tensor([s.top_k for s in sp], device=dev),
            min_p=torch.tensor([s.min_p for s in sp], device=dev),
            seeds=torch.tensor([s.seed & 0x7FFFFFFFFFFFFFFF for s in sp], device=dev),
            positions=torch.tensor([r.state.sampled for r in sampled], device=dev),
        )
        k = max(s.top_logprobs for s in sp)
        tokens, chosen, top_ids, top_vals = sample(lg, params, k)
        toks, lps = tokens.tolist(), chosen.tolist()
        tid = top_ids.tolist() if top_ids is not None else None
        tvl = top_vals.tolist() if top_vals is not None else None
        out: list[RowOutput] = []
        for i, r in enumerate(sampled):
            st = r.state
            st.last_token = toks[i]
            st.sampled += 1
            st.in_prompt = False
            st.pending_lp = None
            row = RowOutput(r.handle, toks[i], lps[i])
            n = st.sampling.top_logprobs
            if n and tid is not None and tvl is not None:
                row.top_ids, row.top_logprobs = tid[i][:n], tvl[i][:n]
            out.append(row)
        return out
