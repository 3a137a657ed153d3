"""Fewer, fuller events when the front door falls behind (issue 27): updates already queued for
a stream leave as ONE chunk, a stream whose loop runs late waits for the pacer's tick so that
tokens gather, and a front door that keeps up still sends one chunk per update. The text and
ids streamed are the same either way."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from radixmesh_wire.pb import api_pb2, scheduler_pb2
from services.model_store import resolve_model
from tokenizer_service.config import TokenizerConfig
from tokenizer_service.core import FrontDoor, GenerateInput
from tokenizer_service.events import Chunk, Complete
from tokenizer_service.pacing import Pacer
from tokenizer_service.routing.deltas import Update
from tokenizer_service.routing.inbox import Inbox
from tokenizer_service.tokenization import Tokenization


@pytest.fixture(scope="module")
def tok() -> Tokenization:
    return Tokenization(resolve_model("default"))


class FakeReplicas:
    """Stands in for the ReplicaSet: one request, its updates put by the test."""

    context_length = 4096  # the model's window, as a ReplicaSet reports it
    ready = True

    def __init__(self) -> None:
        self.queue = Inbox()
        self.aborted = 0

    def submit(self, msg: scheduler_pb2.SubmitRequest) -> Any:
        return SimpleNamespace(queue=self.queue)

    def abort(self, ticket: Any) -> None:
        self.aborted += 1

    def done(self, ticket: Any) -> None:
        pass


def _update(ids: list[int], finish: bool = False) -> Update:
    u = Update()
    u.token_ids = list(ids)
    if finish:
        u.extras = scheduler_pb2.DeltaExtras(finish_reason=api_pb2.FINISH_REASON_LENGTH)
    return u


def _setup(tok: Tokenization) -> tuple[FrontDoor, FakeReplicas, GenerateInput, list[int]]:
    replicas = FakeReplicas()
    core = FrontDoor(TokenizerConfig(scheduler_address="x:1"), tok, replicas)  # type: ignore[arg-type]
    inp = GenerateInput(
        input_ids=[1, 2, 3], stream=True, sampling=api_pb2.SamplingParams(max_new_tokens=64)
    )
    ids = tok.encode("Streaming text: caf\u00e9, \u65e5\u672c, and more words.", False)
    return core, replicas, inp, ids


def _check(tok: Tokenization, events: list[Any], ids: list[int]) -> list[Chunk]:
    chunks = [e for e in events if isinstance(e, Chunk)]
    assert isinstance(events[-1], Complete) and events[-1].output_ids == ids
    assert [t for c in chunks for t in c.token_ids] == ids
    assert "".join(c.text for c in chunks) == tok.decode(ids) == events[-1].text
    return chunks


def test_queued_updates_leave_as_one_chunk(tok: Tokenization) -> None:
    async def main() -> list[Any]:
        core, replicas, inp, ids = _setup(tok)
        for t in ids[:-1]:  # the consumer fell behind: all of it is queued already
            replicas.queue.put_nowait(_update([t]))
        replicas.queue.put_nowait(_update(ids[-1:], finish=True))
        events = [ev async for ev in core.generate(inp)]
        core.pacer.stop()
        return [ids, events]

    ids, events = asyncio.run(main())
    chunks = _check(tok, events, ids)
    assert len(chunks) == 1  # one event instead of len(ids)


def test_a_consumer_that_keeps_up_gets_one_chunk_per_update(tok: Tokenization) -> None:
    async def main() -> list[Any]:
        core, replicas, inp, ids = _setup(tok)
        events: list[Any] = []
        gen = core.generate(inp)
        for i, t in enumerate(ids):
            replicas.queue.put_nowait(_update([t], finish=i == len(ids) - 1))
            events.append(await anext(gen))
        events.append(await anext(gen))
        core.pacer.stop()
        return [ids, events]

    ids, events = asyncio.run(main())
    chunks = _check(tok, events, ids)
    # one chunk per update, except where a character spans tokens (held until complete)
    assert len(chunks) == sum(1 for c in chunks if c.token_ids) and len(chunks) >= len(ids) - 4
    assert [len(c.token_ids) for c in chunks].count(1) >= len(ids) - 8


def test_a_late_loop_gathers_tokens_until_the_tick(tok: Tokenization) -> None:
    async def main() -> list[Any]:
        core, replicas, inp, ids = _setup(tok)
        core.pacer = Pacer(period_s=0.01, busy_s=-1.0)  # always "late"
        events: list[Any] = []

        async def consume() -> None:
            async for ev in core.generate(inp):
                events.append(ev)

        task = asyncio.create_task(consume())
        await asyncio.sleep(0)  # the consumer waits for its first update
        replicas.queue.put_nowait(_update(ids[:1]))
        await asyncio.sleep(0)  # it got it and now waits for the tick...
        for t in ids[1:-1]:  # ...while the rest arrives
            replicas.queue.put_nowait(_update([t]))
        replicas.queue.put_nowait(_update(ids[-1:], finish=True))
        await task
        core.pacer.stop()
        return [ids, events]

    ids, events = asyncio.run(main())
    chunks = _check(tok, events, ids)
    assert len(chunks) == 1


def test_tokens_before_a_failure_still_go_out(tok: Tokenization) -> None:
    async def main() -> list[Any]:
        core, replicas, inp, ids = _setup(tok)
        for t in ids[:3]:
            replicas.queue.put_nowait(_update([t]))
        err = Update()
        err.extras = scheduler_pb2.DeltaExtras(error_code=8, error_message="out of KV")
        replicas.queue.put_nowait(err)
        events: list[Any] = []
        with pytest.raises(Exception, match="out of KV") as info:
            async for ev in core.generate(inp):
                events.append(ev)
        core.pacer.stop()
        return [ids, events, info.value, replicas.aborted]

    ids, events, exc, aborted = asyncio.run(main())
    assert [t for e in events for t in e.token_ids] == ids[:3]
    assert exc.status.name == "RESOURCE_EXHAUSTED"
    assert aborted == 0  # the scheduler ended it: nothing to abort
