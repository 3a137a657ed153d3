"""A request's inbox (routing/inbox.py): the hand-off from the scheduler link to the stream is
one per event, not one per update (issue 27). Plain token updates that the stream has not
taken yet merge into one; the stream applies one update per event; while the front door runs
late the stream is woken once per event (at the pacer's tick), not once for the update and
again for the tick. The ids and text streamed are the same."""

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
from tokenizer_service.text_stream import TextStream
from tokenizer_service.tokenization import Tokenization


@pytest.fixture(scope="module")
def tok() -> Tokenization:
    return Tokenization(resolve_model("default"))


def _update(ids: list[int], rollback: int = 0, finish: bool = False) -> Update:
    u = Update()
    u.token_ids = list(ids)
    u.rollback = rollback
    if finish:
        u.extras = scheduler_pb2.DeltaExtras(finish_reason=api_pb2.FINISH_REASON_LENGTH)
    return u


def test_plain_updates_merge_and_the_rest_keep_their_place() -> None:
    inbox = Inbox()
    for t in (1, 2, 3):
        inbox.put_nowait(_update([t]))
    assert inbox.qsize() == 1  # one update for three steps
    inbox.put_nowait(_update([9], rollback=2))  # a jump-forward: its own item
    inbox.put_nowait(_update([4]))  # plain behind a rollback update: joins it
    inbox.put_nowait(_update([5], finish=True))
    inbox.put_nowait(_update([6]))  # behind a finish: never merged into it
    items = asyncio.run(inbox.take())
    got = [(u.token_ids, u.rollback, u.extras is not None) for u in items if isinstance(u, Update)]
    assert got == [([1, 2, 3], 0, False), ([9, 4], 2, False), ([5], 0, True), ([6], 0, False)]
    assert inbox.empty()


class FakeReplicas:
    """Stands in for the ReplicaSet: one request, its updates put by the test."""

    context_length = 4096  # the model's window, as a ReplicaSet reports it
    ready = True

    def __init__(self) -> None:
        self.queue = Inbox()

    def submit(self, msg: scheduler_pb2.SubmitRequest) -> Any:
        return SimpleNamespace(queue=self.queue)

    def abort(self, ticket: Any) -> None:
        pass

    def done(self, ticket: Any) -> None:
        pass


def _core(tok: Tokenization) -> tuple[FrontDoor, FakeReplicas, GenerateInput]:
    replicas = FakeReplicas()
    core = FrontDoor(TokenizerConfig(scheduler_address="x:1"), tok, replicas)  # type: ignore[arg-type]
    inp = GenerateInput(
        input_ids=[1, 2, 3], stream=True, sampling=api_pb2.SamplingParams(max_new_tokens=64)
    )
    return core, replicas, inp


def test_the_stream_applies_one_update_per_event(
    tok: Tokenization, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 steps' tokens waiting, then the finish: two updates applied (an asyncio.Queue
    gave the stream 21, each applied on its own)."""
    applied: list[int] = []
    on_delta = TextStream.on_delta

    def counted(self: TextStream, u: Update, hold: bool = False) -> Any:
        applied.append(len(u.token_ids))
        return on_delta(self, u, hold)

    monkeypatch.setattr(TextStream, "on_delta", counted)
    ids = tok.encode("Twenty steps of text: caf\u00e9, \u65e5\u672c and more words here.", False)

    async def main() -> list[Any]:
        core, replicas, inp = _core(tok)
        for t in ids[:-1]:
            replicas.queue.put_nowait(_update([t]))
        replicas.queue.put_nowait(_update(ids[-1:], finish=True))
        events = [ev async for ev in core.generate(inp)]
        core.pacer.stop()
        return events

    events = asyncio.run(main())
    chunks = [e for e in events if isinstance(e, Chunk)]
    assert applied == [len(ids) - 1, 1]
    assert len(chunks) == 1 and chunks[0].token_ids == ids
    assert chunks[0].text == tok.decode(ids) and isinstance(events[-1], Complete)


def test_a_late_loop_wakes_the_stream_once_per_event(tok: Tokenization) -> None:
    """Under pacing, each event's tokens arrive as three updates while the stream waits: the
    stream waits on ONE future per event (the asyncio.Queue path made two: the queue's get,
    then the pacer's tick)."""
    ids = tok.encode("one two three four five six seven eight nine", False)[:9]
    steps = [ids[k : k + 3] for k in range(0, 9, 3)]

    async def main() -> tuple[list[Any], int]:
        core, replicas, inp = _core(tok)
        core.pacer = Pacer(period_s=0.005, busy_s=-1.0)  # always "late"
        loop = asyncio.get_running_loop()
        futures = 0
        create = loop.create_future

        def counting() -> asyncio.Future[Any]:
            nonlocal futures
            if asyncio.current_task() is consumer:
                futures += 1
            return create()

        loop.create_future = counting  # type: ignore[method-assign]
        events: list[Any] = []
        chunked = asyncio.Event()

        async def consume() -> None:
            async for ev in core.generate(inp):
                events.append(ev)
                chunked.set()

        consumer = asyncio.create_task(consume())
        for n, step in enumerate(steps):
            while not _waiting(replicas):
                await asyncio.sleep(0)  # let the stream run until it waits for its next event
            last = n == len(steps) - 1
            for k, t in enumerate(step):
                replicas.queue.put_nowait(_update([t], finish=last and k == len(step) - 1))
            if not last:
                chunked.clear()
                await chunked.wait()
        await consumer
        core.pacer.stop()
        return events, futures

    events, futures = asyncio.run(main())
    chunks = [e for e in events if isinstance(e, Chunk)]
    assert [c.token_ids for c in chunks] == steps  # one event per step of three tokens
    assert futures == len(steps)  # one wait (one wake-up) per event


def _waiting(replicas: FakeReplicas) -> bool:
    q: Any = replicas.queue
    if isinstance(q, asyncio.Queue):  # the old path (to check that this test fails there)
        return bool(q._getters)  # type: ignore[attr-defined]
    return q._waiter is not None and not q._waiter.done()


def _events_per_token(live: int, steps: int = 30, ticks_per_step: int = 2) -> float:
    """`live` streams, each a consumer of its own inbox under one manual pacer (16,000
    events/s, 10 ms ticks, 60 ms cap; the inboxes count the streams in at their first take);
    every step puts one token in every inbox, then the pacer ticks `ticks_per_step` times.
    Events = takes; every token is taken once, in order."""

    async def main() -> float:
        pacer = Pacer(events_per_s=16000, max_hold_s=0.06, manual=True)
        inboxes = [Inbox(pacer) for _ in range(live)]
        taken: list[list[int]] = [[] for _ in range(live)]
        takes = 0

        async def consume(k: int) -> None:
            nonlocal takes
            while len(taken[k]) < steps:
                items = await inboxes[k].take()
                takes += 1
                taken[k] += [t for u in items if isinstance(u, Update) for t in u.token_ids]

        tasks = [asyncio.create_task(consume(k)) for k in range(live)]
        for step in range(steps):
            await asyncio.sleep(0)
            for inbox in inboxes:
                inbox.put_token(step)
            for _ in range(ticks_per_step):
                await asyncio.sleep(0)
                pacer.advance()
            assert pacer.streams == live  # each counted in at its first take
        while pacer.waiting():  # the last held tokens: at their tick
            pacer.advance()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert all(t == list(range(steps)) for t in taken)  # none lost, none reordered
        for inbox in inboxes:
            inbox.close()
        assert pacer.streams == 0
        return takes / (live * steps)

    return asyncio.run(main())


def test_many_streams_take_fewer_events_per_token() -> None:
    """The event budget, counted: at 1,024 live streams (hold 6 ticks, 3 steps) a stream
    takes its first token alone, then three steps' tokens per take: 11 takes for 30 tokens.
    At 100 live streams (hold 0) one take per token, as before."""
    assert _events_per_token(1024) == 11 / 30
    assert _events_per_token(100) == 1.0


def test_take_says_when_its_oldest_update_arrived(monkeypatch: pytest.MonkeyPatch) -> None:
    """`oldest`: when the first of the taken updates reached the inbox (the front door's hold
    metric reads it); a merged token does not move it, the next update after a take does."""
    from tokenizer_service.routing import inbox as inbox_mod

    clock = iter([1.0, 5.0, 9.0])
    monkeypatch.setattr(inbox_mod, "perf_counter", lambda: next(clock))

    async def go() -> list[float]:
        box = Inbox()
        box.put_token(1)  # 1.0: the inbox was empty
        box.put_token(2)  # merged: no clock read
        u = Update()
        u.token_ids.append(3)
        box.put_nowait(u)  # merged too
        await box.take()
        first = box.oldest
        box.put_nowait(Exception("link lost"))  # 5.0: empty again
        box.put_token(4)  # behind an exception: appended, not empty
        await box.take()
        second = box.oldest
        box.put_token(5)  # 9.0
        await box.take()
        return [first, second, box.oldest]

    assert asyncio.run(go()) == [1.0, 5.0, 9.0]
