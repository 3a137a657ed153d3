"""A scheduler whose step stream broke gets a new model session without being refused.

The real `ModelWorkerServicer` behind a real gRPC server (a stand-in runner), and the
scheduler's real `ModelLink`. The stream breaks the way an over-size step message broke it
(docs/multimodal.md): the link's channel refuses to send a message over its bound ("INTERNAL:
Internal error from Core") while an earlier step still runs on the model service. gRPC never
marks a call its peer cancelled as done, so the model service refused the reconnection
("a scheduler session is already open") until the old session's steps ended; the scheduler
backed off and retried. Now the newcomer waits for the old session's close and opens then,
after the old step's end and the pool's reset (docs/restart.md).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from typing import Any

import grpc
import pytest
from structlog.testing import capture_logs

import model_service.server as server
import scheduler_service.links.model as model_link
import services.server as kit
from radixmesh_wire.pb import model_pb2, model_pb2_grpc
from radixmesh_wire.step_ops import StepOps, StepOutcome, StepOutput
from scheduler_service.links.model import ModelLink, ModelUnavailable
from tests.unit.test_step_host_costs import _engine, _Runner

SEND_BOUND = 64 * 1024  # the link's send bound in this test: a step over it breaks the stream
WAIT_S = 20.0  # bound on each wait for a condition (never reached when the code is right)


class _HeldRunner(_Runner):
    """Step 1's finish blocks until the test releases it (a long step still running when the
    stream breaks); records the order of finishes and resets."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.release = threading.Event()
        self.events: list[str] = []

    def reset(self) -> None:
        super().reset()
        self.events.append("reset")

    def finish(self, ops: StepOps) -> StepOutput:
        if ops.step_id == 1:
            self.started.set()
            self.release.wait(WAIT_S)
        self.events.append(f"finish {ops.step_id}")
        return super().finish(ops)


@pytest.fixture
def small_send_bound(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    key = "grpc.max_send_message_length"
    options = [o for o in kit.CHANNEL_OPTIONS if o[0] != key] + [(key, SEND_BOUND)]
    monkeypatch.setattr(kit, "CHANNEL_OPTIONS", options)
    yield


async def _until(cond: Callable[[], bool], what: str) -> None:
    """Bounded wait for a condition (polled: it is set by another thread or a log line)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not cond():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def _model_service(
    runner: _Runner,
) -> tuple[grpc.aio.Server, server.ModelWorkerServicer, str]:
    """A real model servicer over `runner`, behind a started gRPC server on a free port."""
    engine = _engine()
    engine.runner = runner
    srv = grpc.aio.server(options=kit.SERVER_OPTIONS)
    sv = server.ModelWorkerServicer(engine)
    model_pb2_grpc.add_ModelWorkerServicer_to_server(sv, srv)
    address = f"127.0.0.1:{srv.add_insecure_port('127.0.0.1:0')}"
    await srv.start()
    return srv, sv, address


async def _scenario(logs: list[MutableMapping[str, Any]]) -> tuple[_HeldRunner, StepOutcome]:
    runner = _HeldRunner()
    srv, _, address = await _model_service(runner)
    old, new = ModelLink(address), ModelLink(address)
    try:
        await old.connect()
        first = old.send(StepOps(step_id=1))
        await _until(runner.started.is_set, "step 1 to run")
        n = SEND_BOUND // 4  # packed int32: this step is several times the bound
        too_big = old.send(StepOps(step_id=2, decode_handles=list(range(n)), decode_slots=[0] * n))
        with pytest.raises(ModelUnavailable):
            await too_big
        with pytest.raises(ModelUnavailable):
            await first
        await old.close()
        # The scheduler reconnects at once (services/reconnect.py: a lost session is retried
        # without a pause): its first attempt must not be refused.
        connecting = asyncio.ensure_future(new.connect(timeout=WAIT_S))
        await _until(
            lambda: connecting.done() or any(e["event"] == "stale_session_waiting" for e in logs),
            "the new session to be answered or to wait",
        )
        if connecting.done():
            connecting.result()  # the old code: FAILED_PRECONDITION, raised here
        runner.release.set()  # step 1 ends; the old session closes; the new one opens
        await connecting
        return runner, await new.send(StepOps(step_id=3))
    finally:
        runner.release.set()
        await new.close()
        await srv.stop(None)


def test_a_broken_stream_hands_the_pool_to_the_next_session(small_send_bound: None) -> None:
    with capture_logs() as logs:
        runner, result = asyncio.run(_scenario(logs))
    assert (result.step_id, result.error) == (3, "")
    # Old session: reset at open, step 1 finished; then the old session's close resets, the
    # new session resets at its open, and only then does a new step run (the new session's own
    # close may add a reset after).
    assert runner.events[:5] == ["reset", "finish 1", "reset", "reset", "finish 3"]
    events = [e["event"] for e in logs]
    assert events.count("session_opened") == 2
    assert events.count("stale_session_waiting") == 1
    closed = [e for e in logs if e["event"] == "model_link_closed"]
    assert "INTERNAL" in str(closed[0]["reason"])


async def _oversize_step() -> tuple[str, list[str], StepOutcome]:
    runner = _HeldRunner()
    runner.release.set()
    srv, _, address = await _model_service(runner)
    old, new = ModelLink(address), ModelLink(address)
    try:
        await old.connect()
        await old.send(StepOps(step_id=1))
        n = SEND_BOUND // 4
        with pytest.raises(ModelUnavailable) as lost:
            await old.send(StepOps(step_id=2, decode_handles=list(range(n)), decode_slots=[0] * n))
        await old.close()
        await new.connect(timeout=WAIT_S)
        return str(lost.value), list(runner.events), await new.send(StepOps(step_id=3))
    finally:
        await new.close()
        await srv.stop(None)


def test_an_oversize_step_is_named_and_never_sent(
    monkeypatch: pytest.MonkeyPatch, small_send_bound: None
) -> None:
    """The link checks a step's encoded size against the message bound before sending: the
    loss names the step and its size instead of gRPC's "Internal error from Core", and the
    model service never sees the step (only steps 1 and 3 finish)."""
    monkeypatch.setattr(model_link, "MAX_MESSAGE_BYTES", SEND_BOUND, raising=False)
    reason, events, result = asyncio.run(_oversize_step())
    assert "step 2 encodes to" in reason and f"over the {SEND_BOUND}-byte message bound" in reason
    assert "finish 2" not in events
    assert (result.step_id, result.error) == (3, "")


class _HeldOpen(_Runner):
    """The first reset (the first session's open) blocks until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.release = threading.Event()

    def reset(self) -> None:
        if not self.started.is_set():
            self.started.set()
            self.release.wait(WAIT_S)
        super().reset()


async def _leave_while_opening() -> StepOutcome:
    runner = _HeldOpen()
    srv, sv, address = await _model_service(runner)
    chan = kit.channel(address)
    stay = asyncio.Event()

    async def requests() -> AsyncIterator[model_pb2.StepRequest]:
        yield model_pb2.StepRequest(open=model_pb2.OpenSession(session_id="leaves"))
        await stay.wait()

    new = ModelLink(address)
    try:
        call = model_pb2_grpc.ModelWorkerStub(chan).Steps(requests())
        await _until(runner.started.is_set, "the session's open to reach its reset")
        call.cancel()  # the scheduler leaves (or its stream breaks) while the session opens
        await _until(
            lambda: bool(getattr(getattr(sv, "_session", None), "over", False)),
            "the model service to see the opening session's caller leave",
        )
        runner.release.set()
        await new.connect(timeout=WAIT_S)
        return await new.send(StepOps(step_id=1))
    finally:
        runner.release.set()
        stay.set()
        await new.close()
        await chan.close()
        await srv.stop(None)


def test_a_caller_leaving_while_its_session_opens_hands_the_pool_back() -> None:
    """Cancelled before its first step (at the open's reset or the `opened` reply), a session
    used to skip its close: the pool stayed held and every later scheduler was refused. A
    scheduler that reconnects and breaks its stream at once (an over-size first step) did so."""
    result = asyncio.run(_leave_while_opening())
    assert (result.step_id, result.error) == (1, "")
