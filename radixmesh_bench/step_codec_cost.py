"""The step codec's cost per step (part `codec` of `radixmesh bench step-cost`).

Each case is one step as the scheduler sends it and its result as the model service answers,
run through the real code on both sides and real serialized bytes:

- scheduler encode: `step_codec.encode_step` + `StepRequest` serialization (what `ModelLink.send`
  puts on the stream);
- model decode: `StepRequest` parse + `decode_step` + `validate_step` against the worker's
  per-request state (what `StepSession._run` and `launch` do before the runner);
- model encode: `encode_output` of the runner's `StepOutput` + `StepReply` serialization;
- scheduler decode: `StepReply` parse + `decode_output` (`ModelLink._read`).

Cases: decode-only steps of 1, 64 and 256 rows, and mixed steps (the same decode rows plus
admissions of 128-token prompts, a chunked-prefill step of continuous batching). Times are the
best of `repeats` medians over `iters` calls each (the box is shared: the best median is the
code's cost, the rest is other people's work).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from model_service.runner import RequestState
from model_service.slot_seq import SlotSeq
from model_service.step_validation import StepLimits, validate_step
from radixmesh_wire.pb import model_pb2
from radixmesh_wire.step_codec import decode_output, decode_step, encode_output, encode_step
from radixmesh_wire.step_ops import AdmitOp, RowOutput, Sampling, StepOps, StepOutput

VOCAB = 128_256
CONTEXT = 8192
PROMPT = 128
LIMITS = StepLimits(vocab_size=VOCAB, kv_capacity=1 << 21, context_length=CONTEXT, max_handles=8192)


def make_step(rows: int, admits: int = 0, step_id: int = 7) -> tuple[StepOps, dict[int, Any]]:
    """A step of `rows` decode rows (handles 0..rows-1, each 300 tokens into its sequence) and
    `admits` admissions of PROMPT-token prompts; and the worker state it is valid against."""
    state: dict[int, Any] = {}
    for h in range(rows):
        st = RequestState(Sampling(temperature=0.0), SlotSeq(range(h * 400, h * 400 + 300)), 172)
        st.has_token = True
        st.in_prompt = False
        state[h] = st
    base = rows * 400
    ops = StepOps(
        step_id=step_id,
        decode_handles=list(range(rows)),
        decode_slots=[h * 400 + 300 for h in range(rows)],
    )
    for i in range(admits):
        h = rows + i
        start = base + i * PROMPT
        ops.admits.append(
            AdmitOp(
                handle=h,
                sampling=Sampling(temperature=0.0, stop_ids=(2,)),
                output_offset=0,
                prefix_slots=[],
                input_ids=[(1000 + 7 * j + i) % VOCAB for j in range(PROMPT)],
                slots=list(range(start, start + PROMPT)),
                sample=True,
                rid=f"bench-{h}",
            )
        )
    return ops, state


def make_output(ops: StepOps) -> StepOutput:
    """The runner's output for `ops`: one sampled row per sampling admit and decode."""
    handles = [a.handle for a in ops.admits if a.sample] + list(ops.decode_handles)
    rows = [RowOutput(h, (h * 7919) % VOCAB, -0.5 - h / 1000) for h in handles]
    return StepOutput(ops.step_id, rows, [], 15.0)


def _best_median(fn: Callable[[], object], iters: int, repeats: int) -> float:
    """Seconds per call: the best over `repeats` of the median of `iters` timed calls."""
    best = float("inf")
    for _ in range(repeats):
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best = min(best, statistics.median(times))
    return best


def measure_case(rows: int, admits: int, iters: int, repeats: int) -> dict[str, Any]:
    ops, state = make_step(rows, admits)
    out = make_output(ops)
    step_bytes = model_pb2.StepRequest(step=encode_step(ops)).SerializeToString()
    reply_bytes = model_pb2.StepReply(result=encode_output(out)).SerializeToString()

    def sched_encode() -> bytes:
        return model_pb2.StepRequest(step=encode_step(ops)).SerializeToString()

    def model_decode() -> StepOps:
        got = decode_step(model_pb2.StepRequest.FromString(step_bytes).step)
        validate_step(got, state, LIMITS)
        return got

    def model_encode() -> bytes:
        return model_pb2.StepReply(result=encode_output(out)).SerializeToString()

    def sched_decode() -> object:
        return decode_output(model_pb2.StepReply.FromString(reply_bytes).result)

    us = {
        name: round(1e6 * _best_median(fn, iters, repeats), 2)
        for name, fn in (
            ("sched_encode_us", sched_encode),
            ("model_decode_us", model_decode),
            ("model_encode_us", model_encode),
            ("sched_decode_us", sched_decode),
        )
    }
    total_rows = rows + admits
    return {
        "decode_rows": rows,
        "admits": admits,
        "step_bytes": len(step_bytes),
        "step_bytes_per_decode_row": round(len(step_bytes) / rows, 2) if rows else None,
        "result_bytes": len(reply_bytes),
        "result_bytes_per_row": round(len(reply_bytes) / total_rows, 2),
        **us,
        "codec_us_per_step": round(sum(us.values()), 2),
    }


def run_codec(sizes: list[int], iters: int, repeats: int) -> dict[str, Any]:
    cases = []
    for rows in sizes:
        cases.append(measure_case(rows, 0, iters, repeats))
        cases.append(measure_case(rows, max(1, rows // 16), iters, repeats))
    return {"cases": cases, "iters": iters, "repeats": repeats, "prompt_tokens": PROMPT}
