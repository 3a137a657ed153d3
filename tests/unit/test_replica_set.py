"""The front door's replica set: routing over links, drain, failover, and the session protocol
of the replica views (cache events, load reports) against in-process fake schedulers that speak
the real gRPC session stream."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2_grpc

from radixmesh_wire.cache_blocks import BLOCK_TOKENS, block_hashes, cache_keys
from radixmesh_wire.packing import pack_i32
from radixmesh_wire.pb import api_pb2, scheduler_pb2, scheduler_pb2_grpc
from services.discovery import AddressSpec
from services.launcher import free_port
from services.server import Health
from tokenizer_service.config import TokenizerConfig
from tokenizer_service.routing.deltas import Update
from tokenizer_service.routing.replica_set import ReplicaSet, Ticket
from tokenizer_service.routing.replica_stats import NoReplicaAnswered, flush_all, gather_stats
from tokenizer_service.routing.router import Policy, Router
from tokenizer_service.routing.scheduler_link import DuplicateRequest, SchedulerLink, SchedulerLost

PROMPT = list(range(1, 41))  # 2 full blocks


def aio(fn: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    @functools.wraps(fn)
    def run() -> None:
        asyncio.run(fn())

    return run


def _submit(rid: str, ids: list[int] = PROMPT, max_new: int = 6) -> scheduler_pb2.SubmitRequest:
    msg = scheduler_pb2.SubmitRequest(rid=rid, input_ids=ids)
    msg.sampling.max_new_tokens = max_new
    return msg


def _set(*addresses: str, policy: Policy = Policy.CACHE_AWARE, hold_s: float = 60) -> ReplicaSet:
    spec = AddressSpec("static", addresses=addresses)
    rs = ReplicaSet(spec, Router(policy), hold_s=hold_s, start_links=False)
    for a in addresses:
        rs.add(a)
    return rs


def _up(link: SchedulerLink) -> None:
    link.view.on_hello("", 0, 1 << 20)
    link.connected.set()
    link.down_since = None


def _tokens(link: SchedulerLink, key: int, tokens: list[int]) -> None:
    u = Update()
    u.token_ids = list(tokens)
    link.live.deliver(key, u)


def _sent(link: SchedulerLink) -> list[scheduler_pb2.FrontendMessage]:
    return [link.out.get_nowait() for _ in range(link.out.qsize())]


def _other(rs: ReplicaSet, link: SchedulerLink) -> SchedulerLink:
    (other,) = [lk for lk in rs.links.values() if lk is not link]
    return other


@aio
async def test_a_repeated_prompt_follows_the_replica_that_got_it() -> None:
    rs = _set("a:1", "b:1")
    for lk in rs.links.values():
        _up(lk)
    first = rs.submit(_submit("r1"))
    rs.done(first)  # finished: the replica still holds its prompt (approximate record)
    again = rs.submit(_submit("r2", [*PROMPT, 7, 8]))
    assert again.link is first.link
    counts = rs.counts[first.link.address].by_reason
    assert counts == {"cold": 1, "cache_hit": 1}
    with pytest.raises(DuplicateRequest):
        rs.submit(_submit("r2"))


@aio
async def test_round_robin_uses_every_replica() -> None:
    rs = _set("a:1", "b:1", policy=Policy.ROUND_ROBIN)
    for lk in rs.links.values():
        _up(lk)
    got = [rs.submit(_submit(f"r{i}")).link.address for i in range(4)]
    assert got == ["a:1", "b:1", "a:1", "b:1"]


@aio
async def test_a_replica_that_goes_down_hands_its_requests_to_another() -> None:
    rs = _set("a:1", "b:1")
    for lk in rs.links.values():
        _up(lk)
    t = rs.submit(_submit("r1"))
    first, queue = t.link, t.queue
    _sent(first)
    _tokens(first, t.key, [11, 12])
    first.connected.clear()
    await rs._on_state(first)  # what the link's run loop does when its stream breaks
    second = _other(rs, first)
    assert t.link is second and t.queue is queue and "r1" in second.keys
    assert len(first.live) == 0 and "r1" not in first.keys
    (moved,) = _sent(second)
    assert moved.submit.rid == "r1" and list(moved.submit.output_ids) == [11, 12]
    assert list(moved.submit.input_ids) == PROMPT and moved.submit.key == t.key
    _tokens(second, t.key, [13])
    got = [queue.get_nowait() for _ in range(queue.qsize())]
    # the same inbox: its tokens, in order (not yet taken plain tokens join: routing/inbox.py)
    assert [u.token_ids for u in got if isinstance(u, Update)] == [[11, 12, 13]]
    assert rs.counts[second.address].moved_in == 1
    assert rs.request_abort("r1")  # abort follows the request
    assert _sent(second)[0].abort.rid == "r1"
    rs.done(t)
    assert not rs.tickets and len(second.live) == 0


@aio
async def test_a_replica_whose_model_is_away_hands_over_and_gets_nothing_new() -> None:
    rs = _set("a:1", "b:1")
    for lk in rs.links.values():
        _up(lk)
    t = rs.submit(_submit("r1"))
    first = t.link
    _sent(first)
    _tokens(first, t.key, [11])
    first.serving = False  # its readiness probe: the scheduler's model is not connected
    await rs._on_state(first)
    second = _other(rs, first)
    assert t.link is second
    assert [m.abort.rid for m in _sent(first)] == ["r1"]  # dropped there, it still runs
    assert list(_sent(second)[0].submit.output_ids) == [11]
    assert all(rs.submit(_submit(f"n{i}")).link is second for i in range(3))
    first.serving = True
    assert {rs.submit(_submit(f"m{i}", [i] * 40)).link.address for i in range(8)} == set(rs.links)


@aio
async def test_with_no_replica_connected_requests_are_held_then_moved() -> None:
    rs = _set("a:1", "b:1")
    t = rs.submit(_submit("r1"))  # nothing connected: held on its link
    held_on = t.link
    assert not _sent(held_on) and len(held_on.live) == 1
    other = _other(rs, held_on)
    _up(other)
    await rs._on_state(other)
    assert t.link is other
    (msg,) = _sent(other)
    assert msg.submit.rid == "r1" and list(msg.submit.output_ids) == []


@aio
async def test_refusals_say_why() -> None:
    with pytest.raises(SchedulerLost, match="resolved to none"):
        _set().submit(_submit("r"))
    rs = _set("a:1", hold_s=0)
    rs.links["a:1"].down_since = 0.0
    with pytest.raises(SchedulerLost, match="reachable for the last 0 s"):
        rs.submit(_submit("r"))


@aio
async def test_a_removed_replica_drains_then_closes() -> None:
    rs = _set("a:1", "b:1")
    for lk in rs.links.values():
        _up(lk)
    t = rs.submit(_submit("r1"))
    leaving = t.link
    staying = _other(rs, leaving)
    await rs.update([staying.address])
    assert leaving.draining and leaving.address in rs.links  # its request still runs
    for i in range(3):  # nothing new goes there
        assert rs.submit(_submit(f"n{i}")).link is staying
    rs.done(t)
    await _until(lambda: leaving.address not in rs.links)
    await rs.update([staying.address, leaving.address])  # it may come back: a fresh link
    back = rs.links[leaving.address]
    assert back is not leaving and not back.draining and not back.connected.is_set()


async def _until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


# --- against fake schedulers over real gRPC


def _token(i: int) -> int:
    return 1000 + i  # a "greedy" model: the token at output position i


class FakeScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Publishes its cache and load like the scheduler of issue 16, and generates _token(i)
    for output positions; `stall_after` stops a request after that many tokens (so a test
    can kill this replica while requests are live)."""

    def __init__(
        self,
        instance: str,
        held: list[int],
        stall_after: int = 10**9,
        host_held: tuple[int, ...] = (),
    ) -> None:
        self.stats = api_pb2.Stats()
        self.flush = scheduler_pb2.FlushCacheResponse(flushed=True, evicted_tokens=5)
        self.instance = instance
        self.held = held
        self.host_held = host_held  # blocks in its host KV tier (issue 31)
        self.stall_after = stall_after
        self.submits: list[scheduler_pb2.SubmitRequest] = []

    async def Session(
        self,
        request_iterator: AsyncIterator[scheduler_pb2.FrontendMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[scheduler_pb2.SchedulerMessage]:
        await anext(aiter(request_iterator))
        yield scheduler_pb2.SchedulerMessage(
            hello=scheduler_pb2.SchedulerHello(
                context_length=2048,
                kv_capacity=4096,
                cache_block_tokens=BLOCK_TOKENS,
                instance_id=self.instance,
            ),
            cache=scheduler_pb2.CacheEvents(reset=True, added=self.held, host=self.host_held),
            load=scheduler_pb2.LoadReport(waiting_tokens=7, running_tokens=3),
        )
        async for msg in request_iterator:
            if msg.WhichOneof("kind") != "submit":
                continue
            s = msg.submit
            self.submits.append(s)
            start, end = len(s.output_ids), s.sampling.max_new_tokens
            stop = min(end, max(start, self.stall_after))
            toks = [_token(i) for i in range(start, stop)]
            out = scheduler_pb2.SchedulerMessage(
                keys=pack_i32([s.key] * len(toks)), events=pack_i32(toks)
            )
            if stop == end:
                out.extras.append(
                    scheduler_pb2.DeltaExtras(key=s.key, finish_reason=api_pb2.FINISH_REASON_LENGTH)
                )
            yield out

    async def GetStats(
        self, request: api_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.Stats:
        return self.stats

    async def FlushCache(
        self, request: scheduler_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.FlushCacheResponse:
        return self.flush


async def _serve(fake: FakeScheduler, ready: bool = True) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(fake, server)
    health = Health()  # the scheduler's readiness: its model is connected
    await health.set_ready(ready)
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    await server.start()
    return server, address


async def _collect(t: Ticket) -> list[int]:
    out: list[int] = []
    while True:
        u = await asyncio.wait_for(t.queue.get(), 10)
        assert not isinstance(u, Exception), u
        out.extend(u.token_ids)
        if u.extras is not None and u.extras.finish_reason:
            return out


async def _running(rs: ReplicaSet, n: int) -> asyncio.Task[None]:
    task = asyncio.create_task(rs.run(Health()))
    await _until(lambda: sum(lk.connected.is_set() for lk in rs.links.values()) == n)
    return task


@aio
async def test_exact_mode_routes_on_what_the_replicas_publish() -> None:
    hashes = block_hashes(cache_keys(PROMPT, ""))
    holder = FakeScheduler("h1", held=hashes)  # holds the prompt's two blocks
    empty = FakeScheduler("e1", held=[])
    (s1, a1), (s2, a2) = await _serve(holder), await _serve(empty)
    rs = ReplicaSet(AddressSpec("static", addresses=(a1, a2)))
    task = await _running(rs, 2)
    try:
        view = rs.links[a1].view
        await _until(lambda: len(view.blocks) == 2)
        assert view.exact and view.instance_id == "h1"
        assert view.load_tokens == 10  # the report
        for i in range(3):
            t = rs.submit(_submit(f"r{i}", max_new=3))
            assert t.link.address == a1
            assert await _collect(t) == [_token(0), _token(1), _token(2)]
            rs.done(t)
        assert rs.counts[a1].by_reason == {"cache_hit": 3}
        assert view.matched_blocks(hashes) == 2 and len(view.blocks) == 2  # no guessing
    finally:
        task.cancel()
        await s1.stop(0)
        await s2.stop(0)


async def _route_once(first: str, second: str) -> tuple[str, str]:
    """Where a fresh ReplicaSet over two replicas sends PROMPT, once both have published."""
    rs = ReplicaSet(AddressSpec("static", addresses=(first, second)))
    task = await _running(rs, 2)
    try:  # the hello's message carries the snapshot and the load report together
        await _until(lambda: all(lk.view.reported is not None for lk in rs.links.values()))
        t = rs.submit(_submit("r", max_new=1))
        assert await _collect(t) == [_token(0)]
        rs.done(t)
        reasons = [r for c in rs.counts.values() for r in c.by_reason]
        return t.link.address, reasons[0]
    finally:
        task.cancel()


@aio
async def test_host_resident_blocks_route_over_grpc_below_gpu_ones() -> None:
    """Issue 31 over real sessions: a replica advertising the prompt's blocks in its host tier
    (CacheEvents.host) takes it from one that holds nothing, as a cache hit, and loses it to
    one holding the same blocks on its GPU (each pair in both address orders, so the cold
    rule's rendezvous order cannot decide it)."""
    hashes = block_hashes(cache_keys(PROMPT, ""))
    fakes = (
        FakeScheduler("host", held=[], host_held=tuple(hashes)),
        FakeScheduler("gpu", held=hashes),
        FakeScheduler("empty", held=[]),
    )
    served = [await _serve(f) for f in fakes]
    host, gpu, empty = (address for _, address in served)
    try:
        for a, b in ((host, empty), (empty, host)):
            assert await _route_once(a, b) == (host, "cache_hit")
        for a, b in ((host, gpu), (gpu, host)):
            assert await _route_once(a, b) == (gpu, "cache_hit")
    finally:
        for server, _ in served:
            await server.stop(0)


@aio
async def test_a_killed_replica_loses_no_request() -> None:
    """Requests on a replica whose server dies continue on the other one, token-exact."""
    stalling = FakeScheduler("s1", held=[], stall_after=2)
    healthy = FakeScheduler("s2", held=[])
    (s1, a1), (s2, a2) = await _serve(stalling), await _serve(healthy)
    rs = ReplicaSet(AddressSpec("static", addresses=(a1, a2)), Router(Policy.ROUND_ROBIN))
    task = await _running(rs, 2)
    try:
        tickets = [rs.submit(_submit(f"r{i}", max_new=5)) for i in range(4)]
        on_stalling = [t for t in tickets if t.link.address == a1]
        assert len(on_stalling) == 2
        await _until(lambda: all(len(t.link.live.by_key[t.key].output) == 2 for t in on_stalling))
        await s1.stop(0)  # the replica dies with live requests
        results = await asyncio.gather(*(_collect(t) for t in tickets))
        assert results == [[_token(i) for i in range(5)]] * 4
        moved = [s for s in healthy.submits if s.output_ids]
        assert sorted(s.rid for s in moved) == sorted(t.rid for t in on_stalling)
        assert all(list(s.output_ids) == [_token(0), _token(1)] for s in moved)
        assert rs.counts[a2].moved_in == 2
        for t in tickets:
            rs.done(t)
    finally:
        task.cancel()
        await s2.stop(0)


@aio
async def test_a_replica_whose_model_connects_is_probed_again_at_once() -> None:
    """A scheduler answering NOT_SERVING (its model still starting) is asked again every
    RECHECK_S, not once a probe period: here the period is a minute, yet the link sees it
    serving right after its readiness turns (a burst meanwhile would all go elsewhere)."""
    server = grpc.aio.server()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(FakeScheduler("late", held=[]), server)
    health = Health()
    await health.set_ready(False)
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    await server.start()
    link = SchedulerLink(address, probe_s=60.0)
    task = asyncio.create_task(link.run())
    try:
        await _until(lambda: link.connected.is_set() and not link.serving)
        await health.set_ready(True)
        await _until(lambda: link.serving)  # _until gives up long before a 60 s period
    finally:
        task.cancel()
        await link.close()
        await server.stop(0)


class LateModelScheduler(FakeScheduler):
    """A scheduler whose front-door session opened before its model connected: the hello
    has no window (0); the model's window arrives with the next load report, as the real
    scheduler sends it once the model is there."""

    async def Session(
        self,
        request_iterator: AsyncIterator[scheduler_pb2.FrontendMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[scheduler_pb2.SchedulerMessage]:
        await anext(aiter(request_iterator))
        yield scheduler_pb2.SchedulerMessage(
            hello=scheduler_pb2.SchedulerHello(context_length=0, instance_id=self.instance)
        )
        self.opened.set()
        await self.model.wait()
        yield scheduler_pb2.SchedulerMessage(
            load=scheduler_pb2.LoadReport(kv_capacity=4096, context_length=131072)
        )
        async for _ in request_iterator:
            pass

    def __init__(self) -> None:
        super().__init__("late", held=[])
        self.opened = asyncio.Event()
        self.model = asyncio.Event()


@aio
async def test_a_model_that_connects_after_the_session_sets_the_window() -> None:
    """The H200 run of 2026-11-27: one replica's front door kept the 4,096 fallback for a
    131,072-token model (its session opened first), so ShareGPT's longest prompts were
    refused; the window now comes with the load report that follows the model's connect."""
    fake = LateModelScheduler()
    server, address = await _serve(fake)
    rs = ReplicaSet(AddressSpec("static", addresses=(address,)))
    task = await _running(rs, 1)
    try:
        await asyncio.wait_for(fake.opened.wait(), 5)
        assert rs.context_length == 0  # no model yet: the front door falls back
        fake.model.set()
        await _until(lambda: rs.context_length == 131072)
    finally:
        task.cancel()
        await server.stop(0)


@aio
async def test_a_replica_that_is_not_ready_gets_no_traffic() -> None:
    """The readiness probe: a scheduler whose model is away (NOT_SERVING) is passed over."""
    (s1, a1), (s2, a2) = (
        await _serve(FakeScheduler("down", held=[]), ready=False),
        await _serve(FakeScheduler("up", held=[])),
    )
    rs = ReplicaSet(AddressSpec("static", addresses=(a1, a2)))
    task = await _running(rs, 2)
    try:
        await _until(lambda: not rs.links[a1].serving)
        assert rs.links[a2].serving
        for i in range(6):
            t = rs.submit(_submit(f"r{i}", [i] * 40, max_new=2))
            assert t.link.address == a2
            assert await _collect(t) == [_token(0), _token(1)]
            rs.done(t)
    finally:
        task.cancel()
        await s1.stop(0)
        await s2.stop(0)


@aio
async def test_stats_sum_the_replicas_and_list_each() -> None:
    one, two = FakeScheduler("i1", held=[]), FakeScheduler("i2", held=[1, 2, 3], host_held=(4, 5))
    one.stats = api_pb2.Stats(
        kv_capacity=100, kv_free=50, prompt_tokens=10, cached_prompt_tokens=2, steps=3
    )
    two.stats = api_pb2.Stats(
        kv_capacity=300, kv_free=250, prompt_tokens=30, cached_prompt_tokens=18, steps=4
    )
    (s1, a1), (s2, a2) = await _serve(one), await _serve(two)
    rs = ReplicaSet(AddressSpec("static", addresses=(a1, a2)), Router(Policy.ROUND_ROBIN))
    task = await _running(rs, 2)
    try:
        rs.done(rs.submit(_submit("r", max_new=1)))
        s = await gather_stats(rs)
        assert (s.kv_capacity, s.kv_free, s.steps) == (400, 300, 7)
        assert s.token_usage == pytest.approx(0.25) and s.cache_hit_rate == pytest.approx(0.5)
        assert s.router_policy == "round_robin"
        by = {r.address: r for r in s.replicas}
        assert by[a2].instance_id == "i2" and by[a2].cached_blocks == 5 and by[a2].exact_cache
        assert by[a2].cached_host_blocks == 2 and by[a1].cached_host_blocks == 0
        assert by[a1].scheduler.steps == 3 and by[a1].connected and by[a1].serving
        assert sum(r.routed["round_robin"] for r in s.replicas) == 1
        await s2.stop(0)  # one replica gone: listed with its error, the rest still summed
        await _until(lambda: not rs.links[a2].connected.is_set())
        s = await gather_stats(rs, timeout=1)
        assert s.kv_capacity == 100 and by[a2].address in {r.address for r in s.replicas}
        assert [r.error != "" for r in s.replicas if r.address == a2] == [True]
        await s1.stop(0)
        await _until(lambda: not rs.links[a1].connected.is_set())
        with pytest.raises(NoReplicaAnswered):
            await gather_stats(rs, timeout=1)
    finally:
        task.cancel()


@aio
async def test_flush_cache_asks_every_replica() -> None:
    busy = FakeScheduler("b", held=[])
    busy.flush = scheduler_pb2.FlushCacheResponse(flushed=False, message="2 requests running")
    (s1, a1), (s2, a2) = await _serve(FakeScheduler("a", held=[])), await _serve(busy)
    rs = ReplicaSet(AddressSpec("static", addresses=(a1, a2)))
    task = await _running(rs, 2)
    try:
        res = await flush_all(rs)
        assert not res.flushed and res.evicted_tokens == 5
        assert res.message == f"{a2}: 2 requests running"
        busy.flush = scheduler_pb2.FlushCacheResponse(flushed=True, evicted_tokens=1)
        res = await flush_all(rs)
        assert (res.flushed, res.evicted_tokens, res.message) == (True, 6, "")
    finally:
        task.cancel()
        await s1.stop(0)
        await s2.stop(0)


def test_bad_router_flags_are_refused_with_the_flag_named() -> None:
    for kw, flag in (
        ({"scheduler_address": "nope"}, "--scheduler-address"),
        ({"balance_rel": 0.5}, "--balance-rel"),
        ({"resolve_interval_s": 0.0}, "--resolve-interval-s"),
    ):
        with pytest.raises(ValueError, match=flag):
            ReplicaSet.from_config(TokenizerConfig(**kw))  # type: ignore[arg-type]
    rs = ReplicaSet.from_config(TokenizerConfig(scheduler_address="dns:///sched:50052"))
    assert rs.spec.kind == "dns" and rs.router.policy is Policy.CACHE_AWARE
