"""The model service's step session per step, without a model (part `session` of `radixmesh
bench step-cost`).

The real `ModelWorkerServicer.Steps` handler runs in this process over a stand-in runner whose
launch and finish return at once (the rows' tokens are made up): what is left is the session's
own work per step, the part of the model service that sits between the scheduler's message and
the GPU: parsing is not included (gRPC hands the handler a parsed message), but `decode_step`,
the step check, the two thread hops (launch on the step thread, finish on the wait thread), the
result's `encode_output` and the session's event-loop turns are. Steps are fed two in flight,
as the scheduler does; the process's CPU time (every thread) is divided by the steps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import torch

from model_service.copy_stats import CopyStats
from model_service.runner import RequestState
from model_service.server import ModelWorkerServicer
from model_service.slot_seq import SlotSeq
from radixmesh_wire.pb import model_pb2
from radixmesh_wire.step_codec import encode_step
from radixmesh_wire.step_ops import RowOutput, Sampling, StepOps, StepOutput


class StandInRunner:
    """`rows` decoding requests; launch and finish return at once."""

    def __init__(self, rows: int) -> None:
        self.requests: dict[int, Any] = {}
        for h in range(rows):
            st = RequestState(Sampling(temperature=0.0), SlotSeq(range(h * 400, h * 400 + 300)), 9)
            st.has_token = True
            st.in_prompt = False
            self.requests[h] = st
        self.pool = SimpleNamespace(capacity=1 << 21, host_capacity=0, copy_stats=CopyStats())
        self.model = object()
        self.mask_source = None

    def reset(self) -> None:  # a new session keeps the stand-in requests
        pass

    def launch(self, ops: StepOps) -> StepOps:
        return ops

    def finish(self, ops: StepOps) -> StepOutput:
        rows = [RowOutput(h, 1000 + h, -0.5) for h in ops.decode_handles]
        return StepOutput(ops.step_id, rows, [], 15.0)


class _Context:
    def add_done_callback(self, cb: Any) -> None:
        pass

    def done(self) -> bool:
        return False

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(details)


def _servicer(rows: int) -> ModelWorkerServicer:
    engine = SimpleNamespace(
        runner=StandInRunner(rows),
        vocab_size=128_256,
        context_length=8192,
        device=torch.device("cpu"),
        model_name="stand-in",
        eos_token_ids=[2],
        dtype=torch.float32,
        attention_backend="none",
        nan_fill=False,
    )
    return ModelWorkerServicer(engine)  # type: ignore[arg-type]


async def _drive(rows: int, steps: int, warmup: int) -> tuple[float, int]:
    sv = _servicer(rows)
    handles = list(range(rows))
    credit: asyncio.Queue[None] = asyncio.Queue()
    for _ in range(2):  # two steps in flight
        credit.put_nowait(None)
    t0 = [0.0]

    async def requests() -> AsyncIterator[model_pb2.StepRequest]:
        yield model_pb2.StepRequest(open=model_pb2.OpenSession(session_id="bench"))
        for i in range(1, warmup + steps + 1):
            await credit.get()
            if i == warmup + 1:
                t0[0] = time.process_time()
            ops = StepOps(step_id=i, decode_handles=handles, decode_slots=handles)
            yield model_pb2.StepRequest(step=encode_step(ops))

    done = 0
    async for reply in sv.Steps(requests(), _Context()):  # type: ignore[arg-type]
        if reply.HasField("result"):
            if reply.result.error:
                raise RuntimeError(reply.result.error)
            done += 1
            if done == warmup + steps:
                break
            credit.put_nowait(None)
    cpu = time.process_time() - t0[0]
    sv.executor.shutdown()
    sv.waiter.shutdown()
    return cpu, steps


def run_session(sizes: list[int], steps: int, repeats: int) -> dict[str, Any]:
    """Per size: the best of `repeats` runs of the session's process CPU per step."""
    out: dict[str, Any] = {}
    for rows in sizes:
        runs = []
        for _ in range(repeats):
            cpu, n = asyncio.run(_drive(rows, steps, warmup=20))
            runs.append(1e3 * cpu / n)
        out[f"rows_{rows}"] = {
            "session_cpu_ms_per_step": round(min(runs), 4),
            "all_runs_ms_per_step": [round(r, 4) for r in runs],
        }
    return out
