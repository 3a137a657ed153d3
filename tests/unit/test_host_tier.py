"""The radix tree's host-memory tier (issue 31): bookkeeping and simulated KV contents.

The stateful machine runs a simulated model service next to the cache: a GPU pool and a host
pool whose cells hold *which token path's KV they contain* (the prefix tuple). Requests write
their computed tokens' cells (the forward pass); the queued copies (``take_copies``) are
executed in order before it, as the model service does. After every rule: every GPU node's
slots and every host copy hold exactly their path's KV (so a load brings back the right KV and
no copy order is wrong), the integrity checks of both tiers hold, and every running request's
slots still hold its prefix.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixmesh_wire.step_ops import KVCopy
from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.publisher import CachePublisher
from scheduler_service.cache.radix_cache import RadixCache
from scheduler_service.planner.policy import SchedulePolicy
from scheduler_service.planner.prefill_adder import admit_prefills
from tests.unit.queue_item import Item

GPU = 12
HOST = 20
TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=9)
SETTINGS = settings(
    max_examples=250,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

Cell = tuple[int, ...] | None


class Pools:
    """What the model service's two pools hold, as token paths."""

    def __init__(self, gpu: int, host: int) -> None:
        self.gpu: list[Cell] = [None] * gpu
        self.host: list[Cell] = [None] * host

    def run(self, copies: list[KVCopy]) -> None:
        for c in copies:
            assert len(c.src) == len(c.dst) and len(set(c.dst)) == len(c.dst)
            src, dst = (self.gpu, self.host) if c.to_host else (self.host, self.gpu)
            vals = [src[s] for s in c.src]
            for d, v in zip(c.dst, vals, strict=True):
                dst[d] = v


class Running:
    def __init__(self, toks: list[int], slots: list[int], node: object, cached: int) -> None:
        self.toks, self.slots, self.node, self.cached = toks, slots, node, cached


class HostTierMachine(RuleBasedStateMachine):
    SCALE = 1  # each drawn token stands for this many (longer paths: whole cache-event blocks)
    WRITE = "write_back"
    BUDGET = 0  # write-through tokens per step (0: the default)

    def __init__(self) -> None:
        super().__init__()
        self.pub = CachePublisher()
        k = self.SCALE
        self.cache = RadixCache(
            SlotAllocator(GPU * k, debug=True),
            host_capacity=HOST * k,
            observer=self.pub,
            host_write=self.WRITE,
        )
        if self.BUDGET:
            assert self.cache.host is not None
            self.cache.host.budget = self.BUDGET
        self.pools = Pools(GPU * k, HOST * k)
        self.running: list[Running] = []
        self.loaded = 0

    def step(self) -> None:
        """A step is sent: the model service runs the queued copies in order."""
        assert self.cache.host is not None
        self.pools.run(self.cache.host.take_copies())

    @rule(toks=TOKENS, finish=st.booleans())
    def request(self, toks: list[int], finish: bool) -> None:
        toks = self.expand(toks)
        c = self.cache
        m = c.match_prefix(toks, len(toks) - 1)
        c.lock(m.node)
        if m.host_len:
            loaded = c.load_host(m)
            if loaded is not None:
                assert loaded.length == m.length + m.host_len
                self.loaded += m.host_len
                m = loaded
        slots = c.alloc(len(toks) - m.length)
        if slots is None:
            c.unlock(m.node)
            self.step()
            return
        self.step()  # copies first, then the forward pass writes the new tokens
        for i in range(m.length):
            assert self.pools.gpu[m.slots[i]] == tuple(toks[: i + 1]), "wrong KV in a hit"
        all_slots = m.slots + slots
        for i in range(m.length, len(toks)):
            self.pools.gpu[all_slots[i]] = tuple(toks[: i + 1])
        r = Running(toks, all_slots, m.node, m.length)
        if finish:
            self._finish(r)
        else:
            self.running.append(r)

    def _finish(self, r: Running) -> None:
        self.cache.insert(r.toks, r.slots)
        self.cache.unlock(r.node)
        self.step()

    @rule(i=st.integers(0, 100))
    def finish(self, i: int) -> None:
        if self.running:
            self._finish(self.running.pop(i % len(self.running)))

    @rule(i=st.integers(0, 100))
    def cancel(self, i: int) -> None:
        if self.running:
            r = self.running.pop(i % len(self.running))
            self.cache.free_slots(r.slots[r.cached :])
            self.cache.unlock(r.node)

    def expand(self, toks: list[int]) -> list[int]:
        k = self.SCALE
        return [t * k + j for t in toks for j in range(k)]

    @rule(n=st.integers(1, GPU))
    def evict(self, n: int) -> None:
        self.cache.evict(n * self.SCALE)
        self.step()

    @rule(toks=TOKENS)
    def match_only(self, toks: list[int]) -> None:
        self.cache.match_prefix(self.expand(toks))  # splits and LRU times, GPU and host parts

    @rule()
    def reset(self) -> None:
        self.cache.reset()
        self.pools = Pools(GPU * self.SCALE, HOST * self.SCALE)
        self.running = []

    @invariant()
    def contents(self) -> None:
        c = self.cache
        owned = [s for r in self.running for s in r.slots[r.cached :]]
        c.check_integrity(len(owned), owned)
        # Cache events mirror every block in its tier (host-only nodes: host-resident blocks).
        self.pub.check_integrity(c.debug_paths(), c.debug_host_paths())
        assert c.host is not None and c.host.queued == 0
        stack: list[tuple[Any, tuple[int, ...]]] = [(n, ()) for n in c._root.children.values()]
        while stack:
            node, above = stack.pop()
            paths = [above + tuple(node.key[: j + 1]) for j in range(len(node.key))]
            if node.value:
                assert [self.pools.gpu[s] for s in node.value] == paths
            if node.host is not None:
                assert [self.pools.host[s] for s in node.host] == paths
            stack.extend((ch, paths[-1]) for ch in node.children.values())
        for r in self.running:
            want = [tuple(r.toks[: i + 1]) for i in range(len(r.toks))]
            assert [self.pools.gpu[s] for s in r.slots] == want


TestHostTierMachine = HostTierMachine.TestCase
TestHostTierMachine.settings = SETTINGS


class LongPathMachine(HostTierMachine):
    """Paths of up to 72 tokens: nodes span 16-token cache-event blocks, so the publisher
    mirror is really exercised through saves, loads and host-only splits."""

    SCALE = 8


TestLongPathMachine = LongPathMachine.TestCase
TestLongPathMachine.settings = settings(SETTINGS, max_examples=100)


class WriteThroughMachine(HostTierMachine):
    """The same rules under ``--host-tier-write write_through`` with a 3-token step budget:
    finished paths are copied a few tokens per step (nodes split at the budget), evictions
    before a node's turn fall back to write-back, and every GPU and host cell still holds its
    path's KV."""

    WRITE = "write_through"
    BUDGET = 3


TestWriteThroughMachine = WriteThroughMachine.TestCase
TestWriteThroughMachine.settings = settings(SETTINGS, max_examples=120)


def _cache() -> RadixCache:
    return RadixCache(SlotAllocator(4, debug=True), host_capacity=8)


def test_eviction_saves_to_host_and_a_hit_loads_back() -> None:
    c = _cache()
    s = c.alloc(4)
    assert s is not None
    c.insert([1, 2, 3, 4], s)
    assert c.evict(4) == 4  # the whole path leaves the GPU ...
    assert c.host is not None and c.host.held == 4  # ... into host memory
    copies = c.host.take_copies()
    assert [(x.to_host, x.src) for x in copies] == [(True, s)]
    m = c.match_prefix([1, 2, 3, 4, 5])
    assert (m.length, m.host_len) == (0, 4)
    c.lock(m.node)
    loaded = c.load_host(m)
    assert loaded is not None and loaded.length == 4
    (load,) = c.host.take_copies()
    assert not load.to_host and load.src == copies[0].dst and load.dst == loaded.slots
    assert c.host.stats.host_hit_tokens == 4 and c.host.stats.saved_tokens == 4
    c.check_integrity(0, [])
    c.unlock(loaded.node)
    # Evicted again: the host copy is still there, so no second save is queued.
    assert c.evict(4) == 4
    assert c.host.take_copies() == [] and c.host.stats.saved_tokens == 4
    c.check_integrity(0, [])


def test_host_lru_drops_the_oldest_and_a_full_host_loses_nothing_locked() -> None:
    c = _cache()
    for first in (1, 2, 3):  # three 4-token paths through a 4-slot GPU pool
        s = c.alloc(4)
        assert s is not None
        c.insert([first, 0, 0, 0], s)
    assert c.host is not None
    assert c.host.stats.host_evicted_tokens == 0 and c.host.held == 8
    s = c.alloc(4)  # evicts [3, ...] to the host, which drops the LRU path [1, ...]
    assert s is not None
    c.free_slots(s)
    assert c.host.stats.host_evicted_tokens == 4
    assert c.match_prefix([1, 0, 0, 0]).host_len == 0
    assert c.match_prefix([2, 0, 0, 0]).host_len == 4
    c.check_integrity(0, [])


def test_reset_forgets_both_tiers() -> None:
    c = _cache()
    s = c.alloc(4)
    assert s is not None
    c.insert([1, 2, 3, 4], s)
    c.evict(2)
    c.reset()
    assert c.host is not None and c.host.held == 0 and c.host.queued == 0
    assert c.host.allocator.free_count == 8 and c.free_size == 4
    assert c.match_prefix([1, 2, 3, 4]).host_len == 0
    c.check_integrity(0, [])


def test_flush_drops_both_tiers_and_saves_nothing() -> None:
    c = _cache()
    for toks in ([1, 2], [5, 6]):
        s = c.alloc(2)
        assert s is not None
        c.insert(toks, s)
    c.evict(2)  # the older path goes to the host
    assert c.host is not None and c.host.held == 2
    c.host.take_copies()
    assert c.flush() == 2  # the GPU path, dropped
    assert c.host.held == 0 and c.host.take_copies() == [] and c.total_cached() == 0
    assert c.match_prefix([1, 2, 3]).host_len == 0
    c.check_integrity(0, [])


def test_lpm_ranks_a_host_hit_between_gpu_hits_and_misses_and_admission_loads_it() -> None:
    c = RadixCache(SlotAllocator(16, debug=True), host_capacity=32)
    for toks in ([1] * 8, [2] * 4):  # [1]*8 first: it is the LRU path, evicted to the host
        s = c.alloc(len(toks))
        assert s is not None
        c.insert(toks, s)
    assert c.evict(8) == 8 and c.host is not None
    host_long = Item([1] * 8 + [9], 0)  # 8 host tokens: ranks as 4 GPU tokens
    gpu_short = Item([2] * 3 + [9], 1)  # 3 GPU tokens
    cold = Item([3, 9], 2)
    order = SchedulePolicy("lpm").order([cold, gpu_short, host_long], c)
    assert order == [host_long, gpu_short, cold]
    reader = Item([1] * 8 + [5], 3)  # reads the same prefix: loaded by host_long this step
    plan = admit_prefills(order + [reader], c, chunk_budget=4, max_running=8, num_running=0)
    first = plan.admitted[0]
    # Loaded, not recomputed: its 8 host tokens are prefix. Load-ahead: it is admitted
    # loading (it computes nothing this step; its first row goes in the next one), and the
    # chunk budget went to the next requests; the request that reads the prefix being loaded
    # waits with it, although its own match is all on the GPU.
    assert first.item is host_long and first.prefix_len == 8 and first.n_tokens == 0
    assert first.loading and not first.new_slots
    rest = {a.item.arrival: a for a in plan.admitted[1:]}
    assert (rest[1].n_tokens, rest[2].n_tokens, rest[1].loading, rest[2].loading) == (1, 2, 0, 0)
    last = rest[3]
    assert last.loading and last.prefix_len == 8 and last.match.host_len == 0
    assert c.loading(last.match) and not c.loading(rest[1].match)
    assert c.host.stats.host_hit_tokens == 8
    assert [x.to_host for x in c.host.take_copies()] == [True, False]
    # The step is sent: from the next one on, the loaded prefix is readable.
    assert not c.loading(c.match_prefix(reader.tokens, 8))
    for a in plan.admitted:
        c.free_slots(a.new_slots)
        c.unlock(a.match.node)
    c.check_integrity(0, [])


class LongPathWriteThroughMachine(WriteThroughMachine):
    """Write-through on 16-token cache-event blocks: the budget (20) splits nodes mid-block,
    and the publisher's mirror must still list every block in its tier."""

    SCALE = 8
    BUDGET = 20


TestLongPathWriteThroughMachine = LongPathWriteThroughMachine.TestCase
TestLongPathWriteThroughMachine.settings = settings(SETTINGS, max_examples=60)
