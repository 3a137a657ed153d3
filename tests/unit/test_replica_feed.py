"""Cache events and load reports reach every front-door session (sessions/replica_feed.py):
batched with a flush (one feed per flush, the same for every session, also to sessions with
no output of their own), load only when it changed and at most every few ms (except right
before idling), a reset when the model is lost, nothing cache-wise with --cache-events off or
a table cache. The real Scheduler runs against a fake model link (tests.unit.test_scheduler_loop).
"""

from __future__ import annotations

import asyncio

from radixmesh_wire.cache_blocks import BLOCK_TOKENS, block_hashes
from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.prefix_cache import make_prefix_cache
from scheduler_service.cache.publisher import CacheDelta, CachePublisher
from scheduler_service.config import SchedulerConfig
from scheduler_service.links.frontend import batch_to_proto
from scheduler_service.metrics import SchedulerMetrics
from scheduler_service.request import Request, SamplingSpec
from scheduler_service.scheduler import Scheduler
from scheduler_service.sessions.outbox import Batch
from scheduler_service.sessions.replica_feed import Feed, Load, ReplicaFeed, load_of
from scheduler_service.state import SchedState
from tests.unit.test_scheduler_loop import FakeHealth, FakeLink, _until

PROMPT = list(range(10, 50))  # 40 tokens: blocks 0 and 1 are whole


def _req(rid: str, key: int, session: str = "s", prompt: list[int] | None = None) -> Request:
    return Request(
        rid=rid,
        session=session,
        prompt=list(PROMPT if prompt is None else prompt),
        spec=SamplingSpec(temperature=0, max_new_tokens=3),
        eos_ids=frozenset({2}),
        key=key,
    )


def _held(batches: list[Batch]) -> set[int]:
    held: set[int] = set()
    for b in batches:
        c = b.feed.cache if b.feed is not None else None
        if c is not None:
            if c.reset:
                held.clear()
            held.update(c.added)
            held.difference_update(c.removed)
    return held


def _loads(batches: list[Batch]) -> list[Load]:
    return [b.feed.load for b in batches if b.feed is not None and b.feed.load is not None]


async def _serve(
    cfg: SchedulerConfig, lose_model: bool = False
) -> tuple[Scheduler, list[Batch], list[Batch]]:
    """Submit one request from session "s" while session "other" only listens."""
    sched = Scheduler(cfg)
    # The fake model answers at once: see every step's load.
    sched.feed.load_interval_s = sched.feed.load_cost_factor = 0.0
    link = FakeLink()
    sched.model.link = link  # type: ignore[assignment]
    mine: list[Batch] = []
    other: list[Batch] = []
    sched.sinks["s"] = mine.append
    sched.sinks["other"] = other.append
    task = asyncio.create_task(sched.model.run(FakeHealth()))  # type: ignore[arg-type]
    await _until(lambda: link.connected)
    sched.submit(_req("r", 1))
    await _until(lambda: any(ex.key == 1 and ex.finish for b in mine for ex in b.extras))
    await _until(lambda: bool(_loads(other)) and _loads(other)[-1].running_requests == 0)
    if lose_model:
        sessions = link.sessions
        link.closed.set()
        await _until(lambda: link.sessions > sessions and link.connected)
        await _until(lambda: any(b.feed and b.feed.cache and b.feed.cache.reset for b in other))
    task.cancel()
    return sched, mine, other


def test_every_session_gets_the_same_feed_once_per_flush() -> None:
    sched, mine, other = asyncio.run(_serve(SchedulerConfig()))
    # The prompt and all but the last output token were inserted: the prompt's two blocks.
    assert _held(other) == _held(mine) == set(block_hashes(PROMPT))
    assert sched.feed.publisher is not None and sched.feed.block_tokens == BLOCK_TOKENS
    assert sched.feed.publisher.held() == set(block_hashes(PROMPT))
    # The listener got feed-only messages, each one the very feed the submitter got.
    assert all(not b.keys and not b.extras and b.feed is not None for b in other)
    assert [b.feed for b in other] == [b.feed for b in mine if b.feed is not None]
    # Batched: one message per flush however many blocks changed (the first prefill's flush
    # carries both blocks together).
    adds = [b.feed.cache.added for b in other if b.feed and b.feed.cache and b.feed.cache.added]
    assert sorted(adds[0]) == sorted(block_hashes(PROMPT))
    loads = _loads(other)
    running = [ld for ld in loads if ld.running_requests == 1]
    assert running and all(0 <= ld.running_tokens <= len(PROMPT) + 3 for ld in running)
    assert loads[-1] == Load(
        0, 0, 0, 0, 256, 256, context_length=64
    )  # idle: everything free or evictable
    assert all(a != b for a, b in zip(loads, loads[1:], strict=False))  # only changes are sent


def test_losing_the_model_publishes_a_reset() -> None:
    _, _, other = asyncio.run(_serve(SchedulerConfig(), lose_model=True))
    resets = [i for i, b in enumerate(other) if b.feed and b.feed.cache and b.feed.cache.reset]
    assert resets[0] == 0  # the first model session starts from an empty cache
    lost = resets[1]
    assert _held(other[:lost]) == set(block_hashes(PROMPT))
    assert _held(other) == set()


def test_cache_events_off_and_table_cache_publish_load_only() -> None:
    for cfg in (SchedulerConfig(cache_events="off"), SchedulerConfig(radix="table")):
        sched, _, other = asyncio.run(_serve(cfg))
        assert sched.feed.publisher is None and sched.feed.block_tokens == 0
        assert not any(b.feed and b.feed.cache for b in other)
        assert _loads(other)[-1].running_requests == 0


def _state(publisher: CachePublisher | None) -> SchedState:
    cache = make_prefix_cache("tree", SlotAllocator(64), observer=publisher)
    return SchedState(cache=cache, context_length=64)


def test_load_is_rate_limited_unless_idle_and_sent_only_when_changed() -> None:
    now = [0.0]
    feed = ReplicaFeed(None, load_interval_s=0.005, load_cost_factor=0.0, clock=lambda: now[0])
    st = _state(None)
    first = feed.collect(st)
    assert first == Feed(None, Load(0, 0, 0, 0, 64, 64, context_length=64))
    assert feed.collect(st, force_load=True) is None  # unchanged: nothing to send
    st.waiting.append(_req("w", 1))
    now[0] += 0.001
    assert feed.collect(st) is None  # changed, but within the interval
    now[0] += 0.005
    got = feed.collect(st)
    assert got is not None and got.load is not None
    # Not matched yet: every prompt token and the whole output budget count as waiting work.
    assert (got.load.waiting_requests, got.load.waiting_tokens) == (1, len(PROMPT) + 3)
    st.waiting.clear()
    now[0] += 0.001
    idle = feed.collect(st, force_load=True)  # before idling the limit does not apply
    assert idle is not None and idle.load == Load(0, 0, 0, 0, 64, 64, context_length=64)


def test_waiting_work_counts_a_shared_prefix_once_and_running_kv_once() -> None:
    st = _state(None)
    shared = list(range(100, 132))  # two whole blocks
    a, b = _req("a", 1, prompt=shared + [7, 8, 9]), _req("b", 2, prompt=shared + [5, 6])
    other = _req("c", 3, prompt=list(range(200, 240)))  # shares nothing: all of it counts
    for r in (a, b, other):
        r.fill = list(r.prompt)
        st.waiting.append(r)
    # 32 shared once + 3 + 2 own tails + 40, and each request's budget of 3.
    assert load_of(st).waiting_tokens == 32 + 3 + 2 + 40 + 3 * 3
    # b's first block is known cached (its last match): only its uncached rest counts, and a
    # still counts the whole prefix it does not know to be cached.
    b.match = st.cache.match_prefix(b.fill)  # nothing cached: a zero-length match
    assert load_of(st).waiting_tokens == 32 + 3 + 2 + 40 + 3 * 3
    slots = st.cache.alloc(20)
    assert slots is not None
    st.cache.insert(shared[:20], slots)
    b.match = st.cache.match_prefix(b.fill)
    a.match = None
    st.waiting[:] = [b, a]  # b first: it covers block 1 past its match, a adds block 0
    assert load_of(st).waiting_tokens == (12 + 2) + (16 + 3) + 2 * 3
    # Running work: prompt still to prefill plus output budget left; KV held is not work.
    st.waiting.clear()
    a.kv_len, a.output = 20, [1]  # mid-way through a chunked prefill, one token out
    b.kv_len, b.output = len(b.fill), [1, 2, 3]  # prefilled, budget spent
    st.running = {0: a, 1: b}
    assert load_of(st).running_tokens == (len(a.fill) - 20) + 2


def test_a_costly_load_walk_is_spaced_by_its_cost() -> None:
    now = [0.0]
    feed = ReplicaFeed(None, load_interval_s=0.0, load_cost_factor=1e6, clock=lambda: now[0])
    st = _state(None)
    assert feed.collect(st) is not None  # took >= ~1 us: the next walk waits >= ~1 s
    st.waiting.append(_req("w", 1))
    now[0] += 0.01
    assert feed.collect(st) is None
    forced = feed.collect(st, force_load=True)
    assert forced is not None and forced.load is not None and forced.load.waiting_requests == 1


def test_opening_is_the_snapshot_and_the_current_load() -> None:
    pub = CachePublisher()
    feed = ReplicaFeed(pub)
    st = _state(pub)
    slots = st.cache.alloc(40)
    assert slots is not None
    st.cache.insert(PROMPT, slots)
    assert feed.opening(None) == Feed(CacheDelta(True, [], []), None)  # drained state: empty
    feed.collect(st)
    opening = feed.opening(st)
    assert opening.cache == CacheDelta(True, sorted(block_hashes(PROMPT)), [])
    assert opening.load == Load(0, 0, 0, 0, 64, 64, context_length=64)  # the model's window


def test_feed_to_proto() -> None:
    load = Load(1, 2, 3, 4, 5, 6, context_length=131072)
    feed = Feed(CacheDelta(False, [1, 2**64 - 1], [3], [4, 5]), load)
    msg = batch_to_proto(Batch([], [], [], feed))
    c = msg.cache
    assert (c.reset, list(c.added), list(c.removed), list(c.host)) == (
        False,
        [1, 2**64 - 1],
        [3],
        [4, 5],  # host-resident blocks (issue 31)
    )
    ld = msg.load
    assert (ld.waiting_requests, ld.running_requests, ld.waiting_tokens) == (1, 2, 3)
    assert (ld.running_tokens, ld.kv_capacity, ld.kv_free) == (4, 5, 6)
    assert ld.context_length == 131072  # a model that connects later reaches front doors
    plain = batch_to_proto(Batch([1], [7], []))
    assert not plain.HasField("cache") and not plain.HasField("load")


def test_metrics_gauge_counts_the_published_blocks() -> None:
    pub = CachePublisher()
    feed = ReplicaFeed(pub)
    st = _state(pub)
    metrics = SchedulerMetrics(lambda: st, 8, cache_blocks=feed.published_blocks)
    slots = st.cache.alloc(40)
    assert slots is not None
    st.cache.insert(PROMPT, slots)
    assert metrics.registry.get_sample_value("radixmesh_cache_blocks") == 2
    st.cache.evict(40)
    assert metrics.registry.get_sample_value("radixmesh_cache_blocks") == 0
    assert ReplicaFeed(None).published_blocks() == 0


class _HeldStep(FakeLink):
    """A model step that does not come back until `go` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.sent = 0

    def send(self, ops):  # type: ignore[no-untyped-def]
        self.sent += 1
        done = super().send(ops)
        held: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        async def later() -> None:
            await self.go.wait()
            held.set_result(done.result())

        self._task = asyncio.ensure_future(later())
        return held  # type: ignore[return-value]


def test_a_submitted_prompt_is_published_before_its_step_ends_and_withdrawn_after() -> None:
    other_prompt = list(range(60, 80))  # one whole block; aborted before its prefill

    async def run() -> tuple[list[Batch], set[int], set[int]]:
        sched = Scheduler(SchedulerConfig(overlap="off"))  # one step out at a time
        link = _HeldStep()
        sched.model.link = link  # type: ignore[assignment]
        seen: list[Batch] = []
        sched.sinks["s"] = lambda b: None
        sched.sinks["other"] = seen.append
        task = asyncio.create_task(sched.model.run(FakeHealth()))  # type: ignore[arg-type]
        await _until(lambda: link.connected)
        sched.submit(_req("a", 1))
        await _until(lambda: link.sent > 0)  # a's prefill is under way and held
        sched.submit(_req("b", 2, prompt=other_prompt))  # waits behind it
        # Both prompts' blocks reach the listener while the step is still out.
        want = set(block_hashes(PROMPT)) | set(block_hashes(other_prompt))
        await _until(lambda: _held(seen) == want)
        during = _held(seen)
        assert link.sent == 1
        assert sched.abort("b")
        link.go.set()
        await _until(lambda: not sched.by_rid)
        await _until(lambda: sched.feed.publisher is not None and not sched.feed._holds)
        task.cancel()
        return seen, during, _held(seen)

    seen, during, after = asyncio.run(run())
    assert during == set(block_hashes(PROMPT)) | set(block_hashes(other_prompt))
    # Afterwards only what the tree caches: a's prompt; b left before its prefill.
    assert after == set(block_hashes(PROMPT))
