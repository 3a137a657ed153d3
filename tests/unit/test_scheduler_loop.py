"""The scheduling loop survives an exception in a step (issue 12 item 2: an empty submission
once killed it for good while health said SERVING): the requests in hand fail with a clear
status, readiness drops while it resets, and the next request is served."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from radixmesh_wire.step_ops import StepOps, StepOutcome, WorkerInfo
from scheduler_service.config import SchedulerConfig
from scheduler_service.grammar.step_masks import StepMasks
from scheduler_service.planner.batch_builder import BatchBuilder
from scheduler_service.request import Request, SamplingSpec
from scheduler_service.scheduler import Scheduler, SubmitError
from scheduler_service.sessions.outbox import Batch
from scheduler_service.status import Status


class FakeLink:
    """Answers every step at once: each sampling row gets token 7."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.sessions = 0

    @property
    def connected(self) -> bool:
        return self.sessions > 0 and not self.closed.is_set()

    async def connect(self) -> WorkerInfo:
        self.sessions += 1
        self.closed = asyncio.Event()
        return WorkerInfo("fake", 256, 64, 100, False, eos_token_ids=(2,), device="cpu")

    def send(self, ops: StepOps) -> asyncio.Future[StepOutcome]:
        handles = [a.handle for a in ops.admits if a.sample]
        handles += [e.handle for e in ops.extends if e.sample] + list(ops.decode_handles)
        fut: asyncio.Future[StepOutcome] = asyncio.get_running_loop().create_future()
        fut.set_result(StepOutcome(ops.step_id, handles, [7] * len(handles), [0.0] * len(handles)))
        return fut

    async def close(self) -> None:
        self.closed.set()


class FakeHealth:
    def __init__(self) -> None:
        self.calls: list[tuple[bool, str]] = []

    async def set_ready(self, ready: bool, reason: str) -> None:
        self.calls.append((ready, reason))


async def _until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll a condition with a deadline (never a bare sleep as synchronisation)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


def _req(rid: str, key: int, prompt: list[int] | None = None) -> Request:
    return Request(
        rid=rid,
        session="s",
        prompt=prompt or [1, 3, 4],
        spec=SamplingSpec(temperature=0, max_new_tokens=3),
        eos_ids=frozenset({2}),
        key=key,
    )


def test_loop_survives_a_crashing_step(monkeypatch: Any) -> None:
    real_build = BatchBuilder.build
    crashes = [1]

    def build(self: BatchBuilder) -> Any:
        if crashes:
            crashes.pop()
            raise RuntimeError("boom")
        return real_build(self)

    async def no_masks(self: StepMasks, plan: Any) -> None:
        return None

    monkeypatch.setattr(BatchBuilder, "build", build)
    monkeypatch.setattr(StepMasks, "before_send", no_masks)

    async def scenario() -> tuple[list[Batch], FakeHealth, FakeLink]:
        sched = Scheduler(SchedulerConfig())
        link = FakeLink()
        sched.model.link = link  # type: ignore[assignment]
        out: list[Batch] = []
        sched.sinks["s"] = out.append
        health = FakeHealth()
        task = asyncio.create_task(sched.model.run(health))  # type: ignore[arg-type]
        await _until(lambda: link.connected)
        sched.submit(_req("first", 1))
        await _until(lambda: link.sessions >= 2 and link.connected)  # crashed, reset, back
        sched.submit(_req("second", 2))
        await _until(lambda: any(ex.key == 2 and ex.finish for b in out for ex in b.extras))
        task.cancel()
        return out, health, link

    out, health, link = asyncio.run(scenario())
    first = [ex for b in out for ex in b.extras if ex.key == 1]
    assert first and first[0].error_code == Status.INTERNAL
    assert "scheduler error: RuntimeError: boom" in first[0].error_message
    tokens = [ev for b in out for k, ev in zip(b.keys, b.events, strict=True) if k == 2]
    assert tokens == [7, 7, 7]
    assert [ready for ready, _ in health.calls] == [True, False, True]
    assert "crashed" in health.calls[1][1]


class GatedLink(FakeLink):
    """A model service that answers its first session only once `gate` is set (a scheduler
    restarted while its model is still starting)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def connect(self) -> WorkerInfo:
        await self.gate.wait()
        return await super().connect()


def test_submissions_before_the_first_model_session_are_held() -> None:
    """A front door resubmits its live requests as soon as a restarted scheduler accepts its
    session, which can be before that scheduler's model session is open: they wait (bounded),
    are validated when the model answers, and are served; an invalid one fails alone."""

    async def scenario() -> list[Batch]:
        sched = Scheduler(SchedulerConfig())
        link = GatedLink()
        sched.model.link = link  # type: ignore[assignment]
        out: list[Batch] = []
        sched.sinks["s"] = out.append
        task = asyncio.create_task(sched.model.run(FakeHealth()))  # type: ignore[arg-type]
        sched.submit(_req("held", 1))
        # The model's window is 64 tokens, known only once it connects.
        sched.submit(_req("too-long", 2, prompt=[1] * 100))
        sched.submit(_req("gone", 3))
        assert sched.abort("gone", "s")
        assert len(sched.early) == 2 and not out
        link.gate.set()
        await _until(lambda: any(ex.key == 1 and ex.finish for b in out for ex in b.extras))
        task.cancel()
        return out

    out = asyncio.run(scenario())
    assert [ev for b in out for k, ev in zip(b.keys, b.events, strict=True) if k == 1] == [7, 7, 7]
    refused = [ex for b in out for ex in b.extras if ex.key == 2]
    assert refused and refused[0].error_code == Status.INVALID_ARGUMENT
    assert not [ex for b in out for ex in b.extras if ex.key == 3]


def test_startup_hold_is_bounded() -> None:
    async def scenario() -> list[Batch]:
        sched = Scheduler(SchedulerConfig(max_queue=1, model_hold_s=0.05))
        sched.model.link = GatedLink()  # type: ignore[assignment]
        out: list[Batch] = []
        sched.sinks["s"] = out.append
        sched.submit(_req("a", 1))
        try:
            sched.submit(_req("b", 2))
        except SubmitError as exc:
            assert exc.code == Status.RESOURCE_EXHAUSTED
        else:
            raise AssertionError("a second held request exceeded --max-queue=1")
        task = asyncio.create_task(sched.model.run(FakeHealth()))  # type: ignore[arg-type]
        sched.model.link.connect = _never  # type: ignore[method-assign,assignment]
        await _until(lambda: bool(out))
        task.cancel()
        return out

    out = asyncio.run(scenario())
    (ex,) = out[0].extras
    assert ex.key == 1 and ex.error_code == Status.UNAVAILABLE
    assert "--model-hold-s" in ex.error_message


async def _never(*_: object) -> WorkerInfo:
    from scheduler_service.links.model import ModelUnavailable

    raise ModelUnavailable("model service unreachable")
