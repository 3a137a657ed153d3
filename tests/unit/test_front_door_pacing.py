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
    """The lag rule: while the loop runs late a stream's next event waits for the next tick;
    its first token still goes at once."""

    async def main() -> list[Any]:
        core, replicas, inp, ids = _setup(tok)
        core.pacer = Pacer(busy_s=-1.0, manual=True)  # always "late"
        events: list[Any] = []

        async def consume() -> None:
            async for ev in core.generate(inp):
                events.append(ev)

        task = asyncio.create_task(consume())
        await _settle(replicas)  # the consumer waits for its first update
        replicas.queue.put_nowait(_update(ids[:1]))
        await _settle(replicas)  # it sent it and now waits for the next...
        for t in ids[1:-1]:  # ...while the rest arrives before the tick
            replicas.queue.put_nowait(_update([t]))
            await _settle(replicas)
        sent_before_tick = len(events)
        core.pacer.advance(lag=1.0)
        await _settle(replicas)
        replicas.queue.put_nowait(_update(ids[-1:], finish=True))
        await task
        return [ids, events, sent_before_tick]

    ids, events, sent_before_tick = asyncio.run(main())
    chunks = _check(tok, events, ids)
    assert sent_before_tick == 1 and chunks[0].token_ids == ids[:1]
    assert [c.token_ids for c in chunks[1:]] == [ids[1:-1], ids[-1:]]


async def _settle(replicas: FakeReplicas) -> None:
    """Let the consumer run until it waits for its inbox again (a bounded number of loop
    turns: no clock)."""
    for _ in range(1000):
        await asyncio.sleep(0)
        w = replicas.queue._waiter
        if w is not None and not w.done():
            return
    raise AssertionError("the consumer never waited for its inbox")


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


# ---------------------------------------------------------------- the event budget


def test_the_hold_follows_the_live_streams() -> None:
    """16,000 events/s over 10 ms ticks: 160 streams fit one event each per tick; beyond, a
    stream's events are spaced by live / 160 ticks, at most the cap (60 ms = 6 ticks)."""
    p = Pacer(events_per_s=16000, max_hold_s=0.06, manual=True)
    assert [p.hold_for(n) for n in (0, 1, 159, 160, 319, 320, 640, 1024, 5000)] == [
        0, 0, 0, 1, 1, 2, 4, 6, 6,
    ]  # fmt: skip
    assert Pacer(events_per_s=0, manual=True).hold_for(5000) == 0  # off: the lag rule alone
    p.streams = 1024
    p.advance()
    assert p.hold == 6 and p.due(-1) == 0  # a first event is never held
    assert p.due(p.tick) == p.tick + 6 and p.due(p.tick - 6) == 0


def _stepped(
    tok: Tokenization, live: int, ticks_per_step: int = 2
) -> tuple[list[int], list[Any], list[int]]:
    """One stream while `live` - 1 others are live: each step puts its next token, then the
    pacer ticks `ticks_per_step` times (a 20 ms step over 10 ms ticks); the last token comes
    with the finish. Returns the ids, the events and the tick at which each chunk left."""

    async def main() -> tuple[list[int], list[Any], list[int]]:
        core, replicas, inp, ids = _setup(tok)
        core.pacer = pacer = Pacer(events_per_s=16000, max_hold_s=0.06, manual=True)
        pacer.streams = live - 1  # the others; generate counts this one in
        events: list[Any] = []
        at: list[int] = []

        async def consume() -> None:
            async for ev in core.generate(inp):
                events.append(ev)
                if isinstance(ev, Chunk):
                    at.append(pacer.tick)

        task = asyncio.create_task(consume())
        await _settle(replicas)
        for i, t in enumerate(ids):
            replicas.queue.put_nowait(_update([t], finish=i == len(ids) - 1))
            if i < len(ids) - 1:
                await _settle(replicas)
                for _ in range(ticks_per_step):
                    pacer.advance()
                    await _settle(replicas)
        await task
        assert pacer.streams == live - 1  # counted out again
        return ids, events, at

    return asyncio.run(main())


def test_many_live_streams_send_one_event_per_hold(tok: Tokenization) -> None:
    """1,024 live streams: hold 6 ticks = 3 steps, so after the first token (at once) a stream
    sends one event per 3 steps' tokens; every token once, in order, same text."""
    ids, events, at = _stepped(tok, live=1024)
    chunks = _check(tok, events, ids)
    n = len(ids)
    sizes = [len(c.token_ids) for c in chunks]
    # first token at once; the second event at tick 6 (steps 1-2); then 3 steps each; the
    # finish goes at once with what gathered since
    assert sizes[:2] == [1, 2] and all(s == 3 for s in sizes[2:-1]) and sum(sizes) == n
    assert len(chunks) == 2 + -(-(n - 3) // 3)
    assert all(b - a >= 6 for a, b in zip(at[:-1], at[1:-1], strict=False))  # spaced by hold


def test_few_live_streams_are_never_held(tok: Tokenization) -> None:
    """Below the budget (100 live: hold 0) every token leaves as it comes: one event each."""
    ids, events, _ = _stepped(tok, live=100)
    chunks = _check(tok, events, ids)
    assert [len(c.token_ids) for c in chunks] == [1] * len(ids)


def test_the_final_event_is_never_held(tok: Tokenization) -> None:
    """A held stream with tokens waiting gets its finish at once, without a tick: every
    gathered token goes out with it."""

    async def main() -> tuple[list[int], list[Any], int]:
        core, replicas, inp, ids = _setup(tok)
        core.pacer = pacer = Pacer(events_per_s=16000, manual=True)
        pacer.streams = 2000
        pacer.advance()  # hold 6
        events: list[Any] = []

        async def consume() -> None:
            async for ev in core.generate(inp):
                events.append(ev)

        task = asyncio.create_task(consume())
        await _settle(replicas)
        replicas.queue.put_nowait(_update(ids[:1]))  # the first event: at once
        await _settle(replicas)
        for t in ids[1:-1]:
            replicas.queue.put_nowait(_update([t]))  # held: no wake-up
            await _settle(replicas)
        held = len(events)
        replicas.queue.put_nowait(_update(ids[-1:], finish=True))
        await task
        assert pacer.tick == 1 and pacer.waiting() == 0
        return ids, events, held

    ids, events, held = asyncio.run(main())
    chunks = _check(tok, events, ids)
    assert held == 1 and [c.token_ids for c in chunks] == [ids[:1], ids[1:]]


class ManyReplicas(FakeReplicas):
    """An inbox per request."""

    def __init__(self) -> None:
        super().__init__()
        self.inboxes: list[Inbox] = []

    def submit(self, msg: scheduler_pb2.SubmitRequest) -> Any:
        self.inboxes.append(Inbox())
        return SimpleNamespace(queue=self.inboxes[-1])


def test_a_cancelled_stream_frees_its_wait(tok: Tokenization) -> None:
    """Two held streams wait for the same tick; one client goes away: its wait is cancelled
    (the pacer releases nothing for it), it is aborted and counted out, and the other still
    gets its tokens at the tick. Streams count from their first event on."""

    async def main() -> None:
        replicas = ManyReplicas()
        core = FrontDoor(TokenizerConfig(scheduler_address="x:1"), tok, replicas)  # type: ignore[arg-type]
        core.pacer = pacer = Pacer(events_per_s=16000, manual=True)
        pacer.streams = 2000
        pacer.advance()
        got: list[list[Any]] = [[], []]

        async def consume(k: int) -> None:
            inp = GenerateInput(input_ids=[1, 2, 3], stream=True, sampling=api_pb2.SamplingParams())
            async for ev in core.generate(inp):
                got[k].append(ev)

        tasks = [asyncio.create_task(consume(k)) for k in (0, 1)]
        for _ in range(100):
            await asyncio.sleep(0)
        # submitted, no first event yet (queued at the scheduler): they send nothing, so they
        # do not count against the budget
        assert len(replicas.inboxes) == 2 and pacer.streams == 2000
        for inbox in replicas.inboxes:  # first events, then two held tokens each
            inbox.put_nowait(_update([11]))
        for _ in range(100):
            await asyncio.sleep(0)
        assert pacer.streams == 2002
        for inbox in replicas.inboxes:
            inbox.put_nowait(_update([12]))
            inbox.put_nowait(_update([13]))
        for _ in range(100):
            await asyncio.sleep(0)
        assert pacer.waiting() == 2 and [len(g) for g in got] == [1, 1]
        tasks[0].cancel()
        for _ in range(100):
            await asyncio.sleep(0)
        assert tasks[0].cancelled() and replicas.aborted == 1
        assert pacer.waiting() == 1 and pacer.streams == 2001
        while pacer.tick < 7:  # the hold's tick releases the other
            pacer.advance()
        for _ in range(100):
            await asyncio.sleep(0)
        assert [c.token_ids for c in got[1]] == [[11], [12, 13]] and pacer.waiting() == 0
        replicas.inboxes[1].put_nowait(_update([14], finish=True))
        await tasks[1]
        assert pacer.streams == 2000

    asyncio.run(main())


def test_the_pacing_flags_are_checked() -> None:
    """A negative budget or cap is refused at start with the flag's name (0 turns them off)."""
    from services.config import parse_config

    cfg = parse_config(TokenizerConfig, ["--pacing-events-per-s", "0", "--pacing-max-hold-ms", "0"])
    assert cfg.pacing_events_per_s == 0 and cfg.pacing_max_hold_ms == 0
    for flag in ("--pacing-events-per-s", "--pacing-max-hold-ms"):
        with pytest.raises(ValueError, match=flag):
            parse_config(TokenizerConfig, [flag, "-1"])
