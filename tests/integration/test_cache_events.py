"""Cache events on real processes (issue 16): the shared stack's scheduler (with its model
service) publishes what its radix cache holds to every front-door session.

Sessions here speak the Scheduler.Session protocol as a front door does, with the launcher's
tokenizer certificate. After requests finish, a second session's opening snapshot holds the
prompts' blocks, hashed here independently with `block_hashes` (one prompt in a tenant
namespace); a cache flush then sends their removal to every open session, and a session opened
afterwards no longer sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable

import grpc
import pytest

from radixmesh_wire.cache_blocks import BLOCK_TOKENS, block_hashes, cache_keys
from radixmesh_wire.pb import api_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.conftest import Stack

pytestmark = pytest.mark.integration

_rng = random.Random(16_016)
PROMPT = [_rng.randrange(1000, 40000) for _ in range(40)]  # 2 whole blocks, 8 tokens over
TENANT = "cache-events-tenant"


class FrontDoorSession:
    """One scheduler session: the hello, then every message; cache events applied to `held`
    as a front door applies them."""

    def __init__(self, chan: grpc.aio.Channel, sid: str) -> None:
        self.stub = scheduler_pb2_grpc.SchedulerStub(chan)
        self.sid = sid
        self.out: asyncio.Queue[scheduler_pb2.FrontendMessage | None] = asyncio.Queue()
        self.messages: list[scheduler_pb2.SchedulerMessage] = []
        self.held: set[int] = set()
        self.removed: set[int] = set()  # every hash a (non-reset) event removed
        self.finished: set[int] = set()

    async def open(self) -> scheduler_pb2.SchedulerHello:
        async def outgoing() -> AsyncIterator[scheduler_pb2.FrontendMessage]:
            yield scheduler_pb2.FrontendMessage(
                hello=scheduler_pb2.FrontendHello(session_id=self.sid)
            )
            while (m := await self.out.get()) is not None:
                yield m

        self.call = self.stub.Session(outgoing())
        first = await self.call.read()
        self.reader = asyncio.create_task(self._read())
        return first.hello

    async def _read(self) -> None:
        while (msg := await self.call.read()) is not grpc.aio.EOF:
            self.messages.append(msg)
            if msg.HasField("cache"):
                c = msg.cache
                if c.reset:
                    self.held.clear()
                self.held.update(c.added)
                self.held.difference_update(c.removed)
                self.removed.update(c.removed)
            for ex in msg.extras:
                assert not ex.error_code, ex.error_message
                if ex.finish_reason:
                    self.finished.add(ex.key)

    def submit(self, key: int, namespace: str) -> None:
        s = api_pb2.SamplingParams(temperature=0.0, max_new_tokens=2, ignore_eos=True)
        req = scheduler_pb2.SubmitRequest(rid=f"{self.sid}-{key}", input_ids=PROMPT, sampling=s)
        req.key, req.cache_namespace = key, namespace
        self.out.put_nowait(scheduler_pb2.FrontendMessage(submit=req))

    async def close(self) -> None:
        self.out.put_nowait(None)
        self.call.cancel()
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await self.reader


async def _until(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.02)


def _removed(s: FrontDoorSession, hashes: set[int]) -> Callable[[], bool]:
    return lambda: hashes <= s.removed


def test_sessions_see_finished_prompts_blocks_and_their_eviction(stack: Stack) -> None:
    plain = set(block_hashes(PROMPT))
    tenant = set(block_hashes(cache_keys(PROMPT, TENANT)))
    want = plain | tenant
    assert len(plain) == len(tenant) == 2 and not plain & tenant

    async def scenario() -> None:
        async with stack.channel_as("scheduler", "tokenizer") as chan:
            first = FrontDoorSession(chan, "cache-events-1")
            hello = await first.open()
            assert hello.cache_block_tokens == BLOCK_TOKENS and hello.instance_id
            assert not first.held & want  # nothing of these prompts is cached yet
            first.submit(1, "")
            first.submit(2, TENANT)
            await _until(lambda: first.finished >= {1, 2}, "requests did not finish")
            await _until(lambda: want <= first.held, "the submitting session got no blocks")

            second = FrontDoorSession(chan, "cache-events-2")
            hello2 = await second.open()
            assert hello2.instance_id == hello.instance_id  # the same scheduler process
            await _until(lambda: bool(second.messages), "no snapshot after the hello")
            snapshot = second.messages[0]
            assert snapshot.cache.reset and want <= set(snapshot.cache.added)
            assert snapshot.load.kv_capacity > 0 and snapshot.load.running_requests == 0

            flushed = await scheduler_pb2_grpc.SchedulerStub(chan).FlushCache(
                scheduler_pb2.FlushCacheRequest(), timeout=30
            )
            assert flushed.flushed, flushed.message
            for s in (first, second):  # removals, not a reset, reach every open session
                await _until(_removed(s, want), f"{s.sid}: no removal of the blocks")
                assert not s.held & want

            third = FrontDoorSession(chan, "cache-events-3")
            await third.open()
            await _until(lambda: bool(third.messages), "no snapshot after the hello")
            assert third.messages[0].cache.reset and not set(third.messages[0].cache.added) & want
            for s in (first, second, third):
                await s.close()

    asyncio.run(scenario())
