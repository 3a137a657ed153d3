"""The model service's step session reports its host time per part of a step (issue 27: the
GPU run needs to see whether a launch waits for the GPU): the real `ModelWorkerServicer.Steps`
over a stand-in runner, every `COSTS_EVERY` steps and at the session's end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from structlog.testing import capture_logs

import model_service.server as server
from model_service.copy_stats import CopyStats
from radixmesh_wire.pb import model_pb2
from radixmesh_wire.step_ops import StepOps, StepOutput


class _Runner:
    """Launches and finishes rowless steps at once (the session's own work is what counts)."""

    def __init__(self) -> None:
        self.requests: dict[int, Any] = {}
        self.pool = SimpleNamespace(capacity=64, host_capacity=0, copy_stats=CopyStats())
        self.model = object()
        self.mask_source = None

    def reset(self) -> None:
        self.requests.clear()

    def launch(self, ops: StepOps) -> StepOps:
        return ops

    def finish(self, ops: StepOps) -> StepOutput:
        return StepOutput(ops.step_id, [], [], 1.0)


class _Context:
    def add_done_callback(self, cb: Any) -> None:
        pass

    def done(self) -> bool:
        return False

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(details)


def _engine() -> Any:
    return SimpleNamespace(
        runner=_Runner(),
        vocab_size=100,
        context_length=64,
        device=torch.device("cpu"),
        model_name="stand-in",
        eos_token_ids=[2],
        dtype=torch.float32,
        attention_backend="none",
        nan_fill=False,
    )


async def _session(n_steps: int) -> list[model_pb2.StepReply]:
    sv = server.ModelWorkerServicer(_engine())
    results: asyncio.Queue[model_pb2.StepReply] = asyncio.Queue()

    async def requests() -> AsyncIterator[model_pb2.StepRequest]:
        yield model_pb2.StepRequest(open=model_pb2.OpenSession(session_id="s"))
        for i in range(1, n_steps + 1):
            yield model_pb2.StepRequest(step=model_pb2.Step(step_id=i))
            await results.get()  # one step in flight: the order of lines is then fixed

    replies = []
    async for reply in sv.Steps(requests(), _Context()):  # type: ignore[arg-type]
        replies.append(reply)
        if reply.HasField("result"):
            results.put_nowait(reply)
    return replies


def test_host_costs_are_logged_every_n_steps_and_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "COSTS_EVERY", 3)
    with capture_logs() as logs:
        replies = asyncio.run(_session(4))
    assert [r.result.step_id for r in replies if r.HasField("result")] == [1, 2, 3, 4]
    lines = [e for e in logs if e["event"] == "step_host_costs"]
    assert [(e["reason"], e["steps"]) for e in lines] == [("periodic", 3), ("session closed", 4)]
    for e in lines:
        for part in ("decode", "check", "launch", "encode"):
            assert e[f"{part}_ms_per_step"] >= 0.0
