"""The scheduler's own submission checks: each refusal names the rule, each valid request
passes (the front door is not the only client of the Session stream)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from radixmesh_wire.step_ops import WorkerInfo
from scheduler_service.config import SchedulerConfig
from scheduler_service.request import Request, SamplingSpec
from scheduler_service.scheduler import Scheduler
from scheduler_service.sessions.outbox import Batch
from scheduler_service.status import Status
from scheduler_service.submit_validation import SubmitError, SubmitLimits, validate_submit
from tests.unit.test_scheduler_loop import FakeHealth, FakeLink, _until

LIM = SubmitLimits(vocab_size=1000, context_length=100, kv_capacity=500, max_top_logprobs=20)


def _req(prompt: list[int] | None = None, output: list[int] | None = None, **kw: Any) -> Request:
    eos = kw.pop("eos", frozenset({2}))
    rid = kw.pop("rid", "r1")
    key = kw.pop("key", 7)
    spec = SamplingSpec(**{"max_new_tokens": 8, **kw})
    return Request(
        rid=rid,
        session="s",
        prompt=[1, 2, 3] if prompt is None else prompt,
        spec=spec,
        eos_ids=eos,
        output=output or [],
        key=key,
    )


def test_valid_requests_pass() -> None:
    validate_submit(_req(), LIM)
    validate_submit(_req(prompt=[0] * 99, max_new_tokens=1), LIM)  # fills the window exactly
    validate_submit(_req(prompt=[0] * 100, max_new_tokens=0), LIM)  # prefill only
    validate_submit(_req(stop_token_ids=(999,), min_new_tokens=8, top_logprobs=20), LIM)


BAD = [
    (_req(prompt=[]), "input_ids is empty"),
    (_req(prompt=[1, 1_000_000]), "outside the vocabulary"),
    (_req(prompt=[-1]), "outside the vocabulary"),
    (_req(output=[5000]), "output_ids contain"),
    (_req(eos=frozenset({1000})), "eos_token_ids contain"),
    (_req(stop_token_ids=(1_000_000,), min_new_tokens=2), "stop_token_ids contain"),
    (_req(rid=""), "request id is empty"),
    (_req(key=0), "session key"),
    (_req(temperature=math.inf), "temperature"),
    (_req(temperature=math.nan), "temperature"),
    (_req(temperature=-1.0), "temperature"),
    (_req(top_p=0.0), "top_p"),
    (_req(top_p=math.nan), "top_p"),
    (_req(top_k=-2), "top_k"),
    (_req(min_p=1.5), "min_p"),
    (_req(max_new_tokens=-1), "max_new_tokens"),
    (_req(min_new_tokens=9), "min_new_tokens"),
    (_req(top_logprobs=21), "top_logprobs"),
    (_req(prompt_logprobs_from=3), "prompt_logprobs_from"),
    (_req(presence_penalty=math.inf), "presence_penalty"),
    (_req(repetition_penalty=0.0), "repetition_penalty"),
    (_req(logit_bias=((1000, 1.0),)), "logit_bias"),
    (_req(output=[1] * 9), "exceed max_new_tokens"),
    (_req(prompt=[0] * 101, max_new_tokens=0), "context window is 100"),
    (_req(prompt=[0] * 100, max_new_tokens=1), "context window is 100"),
]


@pytest.mark.parametrize(("req", "needle"), BAD, ids=[n for _, n in BAD])
def test_bad_submissions_refused(req: Request, needle: str) -> None:
    with pytest.raises(SubmitError) as err:
        validate_submit(req, LIM)
    assert err.value.code == Status.INVALID_ARGUMENT
    assert needle in str(err.value)


def test_kv_capacity_bound() -> None:
    small = SubmitLimits(vocab_size=1000, context_length=100, kv_capacity=50, max_top_logprobs=0)
    with pytest.raises(SubmitError, match="exceeds the KV capacity of 50 tokens"):
        validate_submit(_req(prompt=[1] * 45, max_new_tokens=6), small)
    validate_submit(_req(prompt=[1] * 45, max_new_tokens=5), small)


# -- the scheduler's use of them (issue 26 item 6) ---------------------------------------------


class _Link(FakeLink):
    """A model service whose sessions report the given WorkerInfos in turn; each session after
    the first opens only once `gate` is set (the model is away meanwhile)."""

    def __init__(self, *infos: WorkerInfo) -> None:
        super().__init__()
        self.infos = list(infos)
        self.gate = asyncio.Event()

    async def connect(self) -> WorkerInfo:
        if self.sessions:
            await self.gate.wait()
        self.sessions += 1
        self.closed = asyncio.Event()
        return self.infos[min(self.sessions, len(self.infos)) - 1]


def _info(kv: int, ctx: int) -> WorkerInfo:
    return WorkerInfo("fake", kv, ctx, 100, False, eos_token_ids=(2,), device="cpu")


def _sub(rid: str, key: int, n_prompt: int = 3, new: int = 3) -> Request:
    return Request(
        rid=rid,
        session="s",
        prompt=[1] * n_prompt,
        spec=SamplingSpec(temperature=0, max_new_tokens=new, ignore_eos=True),
        eos_ids=frozenset({2}),
        key=key,
    )


def _extras(out: list[Batch], key: int) -> list[Any]:
    return [ex for b in out for ex in b.extras if ex.key == key]


def test_a_live_key_is_refused_and_free_again_once_its_request_ended() -> None:
    async def scenario() -> tuple[list[Batch], SubmitError]:
        sched = Scheduler(SchedulerConfig())
        sched.model.link = _Link(_info(256, 64))  # type: ignore[assignment]
        out: list[Batch] = []
        sched.sinks["s"] = out.append
        task = asyncio.create_task(sched.model.run(FakeHealth()))  # type: ignore[arg-type]
        await _until(lambda: sched.model.link.connected)
        sched.submit(_sub("a", 5))
        with pytest.raises(SubmitError) as dup:
            sched.submit(_sub("b", 5))  # same key, another id: both once were accepted
        await _until(lambda: any(ex.finish for ex in _extras(out, 5)))
        sched.submit(_sub("c", 5))  # `a` ended: its key is free again
        await _until(lambda: sum(bool(ex.finish) for ex in _extras(out, 5)) == 2)
        task.cancel()
        return out, dup.value

    out, dup = asyncio.run(scenario())
    assert dup.code == Status.ALREADY_EXISTS
    assert "session key 5 is in use" in str(dup)
    assert [ex.rid for ex in _extras(out, 5) if ex.finish] == ["a", "c"]
    assert all(not ex.error_code for ex in _extras(out, 5))


def test_held_submissions_are_checked_at_once_where_no_model_is_needed() -> None:
    sched = Scheduler(SchedulerConfig())  # no model session yet: submissions are held
    sched.submit(_sub("a", 1))
    for bad, code, needle in (
        (_sub("a", 2), Status.ALREADY_EXISTS, "is running"),
        (_sub("b", 1), Status.ALREADY_EXISTS, "session key 1"),
        (_sub("c", 3, n_prompt=0), Status.INVALID_ARGUMENT, "input_ids is empty"),
        (_sub("d", 0), Status.INVALID_ARGUMENT, "session key"),
    ):
        with pytest.raises(SubmitError) as err:
            sched.submit(bad)
        assert err.value.code == code and needle in str(err.value)
    assert len(sched.early) == 1


def test_waiting_work_that_a_returning_model_cannot_serve_fails_fast() -> None:
    """The model comes back with a smaller window and pool: a request queued meanwhile that
    fit the old model fails with INVALID_ARGUMENT (before: it waited forever, never admitted),
    and one that still fits is served."""

    async def scenario() -> list[Batch]:
        sched = Scheduler(SchedulerConfig())
        link = _Link(_info(256, 128), _info(64, 48))
        sched.model.link = link  # type: ignore[assignment]
        out: list[Batch] = []
        sched.sinks["s"] = out.append
        task = asyncio.create_task(sched.model.run(FakeHealth()))  # type: ignore[arg-type]
        await _until(lambda: link.connected)
        link.closed.set()  # the model is lost; the scheduler holds new work meanwhile
        await _until(lambda: sched.model.down_since is not None)
        sched.submit(_sub("big", 1, n_prompt=100))  # fits 128 / 256, not 48 / 64
        sched.submit(_sub("small", 2))
        link.gate.set()
        await _until(lambda: bool(_extras(out, 1)) and any(ex.finish for ex in _extras(out, 2)))
        task.cancel()
        return out

    out = asyncio.run(scenario())
    (big,) = _extras(out, 1)
    assert big.error_code == Status.INVALID_ARGUMENT
    assert "came back with other limits" in big.error_message
    assert "context window is 48" in big.error_message
    assert not [k for b in out for k in b.keys if k == 1]  # no token of it
    assert [ev for b in out for k, ev in zip(b.keys, b.events, strict=True) if k == 2] == [7] * 3


def test_the_issue_reproducers_through_the_servicer() -> None:
    """Issue 26 item 6, as a front-door certificate sends them (SubmitRequest protos through
    the servicer): a 5,000-token prompt for a 4,096-token window fails at once with
    INVALID_ARGUMENT naming the window; a second submit under a live key is ALREADY_EXISTS
    (before: accepted, its output mixed into the first request's)."""
    from radixmesh_wire.pb import api_pb2, scheduler_pb2
    from scheduler_service.links.frontend import SchedulerServicer

    def submit(rid: str, key: int, n: int) -> scheduler_pb2.SubmitRequest:
        return scheduler_pb2.SubmitRequest(
            rid=rid,
            key=key,
            input_ids=[5] * n,
            sampling=api_pb2.SamplingParams(max_new_tokens=4, temperature=0),
            eos_token_ids=[2],
        )

    async def scenario() -> list[Batch]:
        sched = Scheduler(SchedulerConfig())
        sched.model.link = _Link(_info(16384, 4096))  # type: ignore[assignment]
        task = asyncio.create_task(sched.model.run(FakeHealth()))  # type: ignore[arg-type]
        await _until(lambda: sched.model.link.connected)
        out: list[Batch] = []
        servicer = SchedulerServicer(sched)
        sched.open_session("s", out.append)
        servicer._submit(submit("long", 1, 5000), "s", out.append)
        servicer._submit(submit("a", 2, 3), "s", out.append)
        servicer._submit(submit("b", 2, 3), "s", out.append)
        await _until(lambda: any(ex.finish for ex in _extras(out, 2)))
        task.cancel()
        return out

    out = asyncio.run(scenario())
    (long,) = _extras(out, 1)
    assert long.error_code == Status.INVALID_ARGUMENT
    assert "5000 tokens but the context window is 4096" in long.error_message
    dup = [ex for ex in _extras(out, 2) if ex.rid == "b"]
    assert dup and dup[0].error_code == Status.ALREADY_EXISTS
    assert [ex.rid for ex in _extras(out, 2) if ex.finish] == ["a"]
