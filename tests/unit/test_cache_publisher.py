"""The cache publisher (scheduler_service.cache.publisher) mirrors the radix tree's held blocks.

Property test: random insert / match (splits) / lock / unlock / chunked prefill
(cache_unfinished) / alloc (evicts) / evict / reset on a real RadixCache with the publisher as
its observer, plus provisional holds of submitted prompts. After every step the published set
must equal the block hashes of every cached root-path prefix whose length is a multiple of
BLOCK_TOKENS, computed here from scratch (from the tree's prefix map and `block_hashes`, not
from the publisher's bookkeeping), together with every live hold's blocks, and front-door
subscribers (a snapshot, then every drain) must hold exactly that set after each drain.

Sequences are built from a few fixed segments of odd lengths, so prompts share long prefixes
and the tree splits at depths that are not multiples of the block size; some carry a namespace
offset (tenant keys >= 2^32).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixmesh_wire.cache_blocks import BLOCK_TOKENS, block_hashes, cache_keys
from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.publisher import GPU, HOST, CacheDelta, CachePublisher
from scheduler_service.cache.radix_cache import RadixCache

CAPACITY = 160
SEGMENTS = [
    list(range(100, 107)),  # 7
    list(range(200, 211)),  # 11
    list(range(300, 316)),  # 16: a whole block
    [5, 6, 5],
    list(range(400, 423)),  # 23
]
OFFSET = cache_keys([0], "tenant")[0]


@st.composite
def sequences(draw: st.DrawFn, min_len: int = 1) -> list[int]:
    parts = draw(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=4))
    toks = [t for p in parts for t in p] + draw(st.lists(st.integers(0, 3), max_size=5))
    toks = toks[: draw(st.integers(min_len, max(len(toks), min_len)))] or [1]
    if draw(st.booleans()) and draw(st.booleans()):
        toks = [t + OFFSET for t in toks]
    return toks


SETTINGS = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def apply(held: dict[int, int], delta: CacheDelta | None) -> None:
    """What a front door does with a CacheEvents message: hash -> tier (GPU or HOST)."""
    if delta is None:
        return
    if delta.reset:
        held.clear()
    for h in delta.removed:
        held.pop(h, None)
    held.update(dict.fromkeys(delta.added, GPU))
    held.update(dict.fromkeys(delta.host, HOST))


class Running:
    def __init__(self, toks: list[int], slots: list[int], node: object, cached: int) -> None:
        self.toks, self.slots, self.node, self.cached = toks, slots, node, cached


class PublisherMachine(RuleBasedStateMachine):
    HOST_CAPACITY = 0  # tokens of the host KV tier (issue 31); 0: none

    def __init__(self) -> None:
        super().__init__()
        self.pub = CachePublisher()
        self.alloc = SlotAllocator(CAPACITY, debug=True)
        self.cache = RadixCache(self.alloc, observer=self.pub, host_capacity=self.HOST_CAPACITY)
        self.owned: list[list[int]] = []
        self.locks: list[object] = []
        self.running: list[Running] = []
        self.subscribers: list[dict[int, int]] = []
        self.holds: list[list[int]] = []  # live requests' prompt blocks

    def expected(self) -> dict[int, int]:
        """Every cached prefix of a whole number of blocks, hashed from scratch, with its tier:
        GPU when its last token is on the GPU or a live request holds it, else HOST when its
        last token is in a host-only node."""
        host: set[int] = set()
        for _, start, path in self.cache.debug_host_paths():
            ends = range(start + 1, len(path) + 1)
            host.update(block_hashes(path[:n])[-1] for n in ends if n % BLOCK_TOKENS == 0)
        prefixes = self.cache.debug_prefix_map()
        gpu = {block_hashes(p)[-1] for p in prefixes if len(p) % BLOCK_TOKENS == 0}
        gpu = gpu.union(*self.holds)
        return dict.fromkeys(host - gpu, HOST) | dict.fromkeys(gpu, GPU)

    # -- provisional holds ----------------------------------------------------------------------
    @rule(toks=sequences())
    def hold(self, toks: list[int]) -> None:
        hashes = block_hashes(toks)
        self.pub.hold(hashes)
        self.holds.append(hashes)

    @precondition(lambda self: self.holds)
    @rule(i=st.integers(0, 1000))
    def release(self, i: int) -> None:
        self.pub.release(self.holds.pop(i % len(self.holds)))

    # -- cache operations (the scheduler's call patterns) -------------------------------------
    @rule(toks=sequences(), limit=st.none() | st.integers(0, 60), keep=st.booleans())
    def match(self, toks: list[int], limit: int | None, keep: bool) -> None:
        m = self.cache.match_prefix(toks, limit)
        if keep:
            self.cache.lock(m.node)
            self.locks.append(m.node)

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 1000))
    def unlock(self, i: int) -> None:
        self.cache.unlock(self.locks.pop(i % len(self.locks)))

    @rule(toks=sequences(), reuse=st.booleans())
    def request(self, toks: list[int], reuse: bool) -> None:
        m = self.cache.match_prefix(toks) if reuse else None
        if m is not None:
            self.cache.lock(m.node)
        prefix = m.slots if m is not None else []
        got = self.cache.alloc(len(toks) - len(prefix))
        if got is not None:
            self.cache.insert(toks, prefix + got)
        if m is not None:
            self.cache.unlock(m.node)

    @rule(toks=sequences(min_len=2), first=st.integers(1, 40))
    def start(self, toks: list[int], first: int) -> None:
        m = self.cache.match_prefix(toks, len(toks) - 1)
        self.cache.lock(m.node)
        got = self.cache.alloc(min(first, len(toks) - m.length))
        if got is None:
            self.cache.unlock(m.node)
            return
        self.running.append(Running(toks, m.slots + got, m.node, m.length))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 1000), n=st.integers(1, 40))
    def next_chunk(self, i: int, n: int) -> None:
        r = self.running[i % len(self.running)]
        got = self.cache.alloc(min(n, len(r.toks) - len(r.slots)))
        if got is not None:
            r.slots += got

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 1000))
    def cache_chunk(self, i: int) -> None:
        r = self.running[i % len(self.running)]
        res = self.cache.cache_unfinished(r.toks[: len(r.slots)], r.slots, r.node)
        if res is not None:
            r.node, r.cached = res.node, res.cached_len

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 1000))
    def finish(self, i: int) -> None:
        r = self.running.pop(i % len(self.running))
        self.cache.insert(r.toks[: len(r.slots)], r.slots)
        self.cache.unlock(r.node)

    @rule(n=st.integers(0, CAPACITY))
    def alloc_slots(self, n: int) -> None:
        got = self.cache.alloc(n)
        if got is not None:
            self.owned.append(got)

    @precondition(lambda self: self.owned)
    @rule(i=st.integers(0, 1000))
    def free_owned(self, i: int) -> None:
        self.cache.free_slots(self.owned.pop(i % len(self.owned)))

    @rule(n=st.integers(1, CAPACITY))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @rule()
    def reset(self) -> None:
        self.cache.reset()
        self.owned.clear()
        self.locks.clear()
        self.running.clear()

    # -- front doors ----------------------------------------------------------------------------
    @rule()
    def subscribe(self) -> None:
        held: dict[int, int] = {}
        apply(held, self.pub.snapshot())
        self.subscribers.append(held)

    @rule()
    def flush(self) -> None:
        delta = self.pub.drain()
        for held in self.subscribers:
            apply(held, delta)
        want = self.expected()
        assert all(held == want for held in self.subscribers)
        assert self.pub.drain() is None  # drained: nothing until the tree changes

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def mirror_matches_tree(self) -> None:
        owned = [s for chunk in self.owned for s in chunk]
        owned += [s for r in self.running for s in r.slots[r.cached :]]
        self.cache.check_integrity(len(owned), owned)
        self.pub.check_integrity(self.cache.debug_paths(), self.cache.debug_host_paths())
        want = self.expected()
        assert self.pub.held() == set(want)
        assert self.pub.host_held() == {h for h, t in want.items() if t == HOST}
        assert self.pub.block_count == len(want)
        assert self.pub.host_block_count == len(self.pub.host_held())


TestPublisherMachine = PublisherMachine.TestCase
TestPublisherMachine.settings = SETTINGS


class HostTierPublisherMachine(PublisherMachine):
    """The same with a host KV tier: GPU eviction saves to host memory (blocks stay published,
    host-resident), the host tier's own LRU drops them (removed), a hit loads them back (GPU
    again), a request recomputing a host-only path puts it back on the GPU, and a flush drops
    both tiers. Subscribers must hold every block in its tier after each drain."""

    HOST_CAPACITY = 96

    @rule(toks=sequences(min_len=2))
    def load_back(self, toks: list[int]) -> None:
        c = self.cache
        m = c.match_prefix(toks, len(toks) - 1)
        c.lock(m.node)
        loaded = c.load_host(m) if m.host_len else None
        c.unlock(m.node if loaded is None else loaded.node)
        self.drain_copies()

    @rule()
    def flush_cache(self) -> None:
        self.cache.flush()
        self.drain_copies()

    def drain_copies(self) -> None:
        assert self.cache.host is not None
        self.cache.host.take_copies()  # the model service would run them with the next step


TestHostTierPublisherMachine = HostTierPublisherMachine.TestCase
# Fewer examples: the plain machine covers the rules they share (CI budget).
TestHostTierPublisherMachine.settings = settings(SETTINGS, max_examples=60)


# -- examples -----------------------------------------------------------------------------------
def _slots(cache: RadixCache, n: int) -> list[int]:
    got = cache.alloc(n)
    assert got is not None
    return got


def _cache() -> tuple[RadixCache, CachePublisher]:
    pub = CachePublisher()
    return RadixCache(SlotAllocator(400), observer=pub), pub


def test_insert_publishes_every_full_block_and_a_shared_prefix_only_once() -> None:
    cache, pub = _cache()
    a = list(range(50))  # 3 full blocks, 2 tokens over
    cache.insert(a, _slots(cache, 50))
    delta = pub.drain()
    assert delta == CacheDelta(False, sorted(block_hashes(a)), [])
    b = list(range(37)) + [999] * 30  # shares 37 tokens: blocks 0 and 1 are already held
    cache.insert(b, _slots(cache, len(b)))
    delta = pub.drain()
    assert delta is not None and not delta.removed
    assert set(delta.added) == set(block_hashes(b)[2:])
    assert pub.held() == set(block_hashes(a)) | set(block_hashes(b))


def test_eviction_removes_only_blocks_no_longer_whole() -> None:
    cache, pub = _cache()
    shared = list(range(20))
    a, b = shared + [1] * 20, shared + [2] * 20  # diverge inside block 1
    cache.insert(a, _slots(cache, 40))
    cache.insert(b, _slots(cache, 40))
    pub.drain()
    m = cache.match_prefix(b)
    cache.lock(m.node)  # b's branch stays; a's leaf is the only evictable leaf
    cache.evict(1)
    delta = pub.drain()
    assert delta == CacheDelta(False, [], sorted(block_hashes(a)[1:]))
    assert pub.held() == set(block_hashes(b))  # block 0 (shared) still held


def test_add_then_evict_between_drains_is_no_change_and_reset_wins() -> None:
    cache, pub = _cache()
    cache.insert(list(range(32)), _slots(cache, 32))
    cache.evict(32)
    assert pub.drain() is None
    cache.insert(list(range(16)), _slots(cache, 16))
    pub.drain()
    cache.reset()
    cache.insert(list(range(100, 116)), _slots(cache, 16))
    assert pub.drain() == CacheDelta(True, block_hashes(list(range(100, 116))), [])


def test_a_snapshot_is_the_last_drained_state_so_the_next_drain_completes_it() -> None:
    cache, pub = _cache()
    old = list(range(32))
    cache.insert(old, _slots(cache, 32))
    pub.drain()
    early = dict.fromkeys(block_hashes(old), GPU)  # a session open since before
    cache.evict(32)
    brief = list(range(500, 516))
    cache.insert(brief, _slots(cache, 16))
    late: dict[int, int] = {}
    apply(late, pub.snapshot())  # a session opening between these changes and their flush
    assert late == early
    cache.evict(16)  # `brief` leaves again before the flush: the drain never mentions it
    new = list(range(600, 616))
    cache.insert(new, _slots(cache, 16))
    delta = pub.drain()
    apply(late, delta)
    apply(early, delta)
    assert late == early == dict.fromkeys(block_hashes(new), GPU)
    assert set(late) == pub.held()


def test_namespaced_keys_hash_as_the_front_door_hashes_a_tenant_prompt() -> None:
    cache, pub = _cache()
    prompt = list(range(7, 40))
    keys = cache_keys(prompt, "tenant-a")
    cache.insert(keys, _slots(cache, len(keys)))
    assert pub.held() == set(block_hashes(cache_keys(prompt, "tenant-a")))
    assert not pub.held() & set(block_hashes(prompt))  # another namespace never matches


def test_a_held_prompt_is_published_at_once_and_withdrawn_only_if_not_cached() -> None:
    cache, pub = _cache()
    a = list(range(1000, 1040))  # two whole blocks and 8 keys
    b = a[:32] + list(range(2000, 2016))  # shares both blocks of a, then one of its own
    ha, hb = block_hashes(a), block_hashes(b)
    pub.hold(ha)
    pub.hold(hb)
    assert pub.drain() == CacheDelta(False, sorted(set(ha + hb)), [])
    pub.release(ha)  # b still holds the shared blocks
    assert pub.drain() is None
    cache.insert(b, _slots(cache, len(b)))  # b prefilled: the tree holds them now
    assert pub.drain() is None
    pub.release(hb)
    assert pub.drain() is None  # cached: still published
    assert pub.held() == set(hb)
    cache.reset()  # model lost: the tree's blocks go, a live hold's stay
    pub.hold(ha)
    assert pub.drain() == CacheDelta(True, sorted(ha), [])
    pub.release(ha)
    assert pub.drain() == CacheDelta(False, [], sorted(ha))
    assert pub.block_count == 0


# -- the host tier (issue 31): a block's tier follows its node ------------------------------------
def _tiered(gpu: int = 64, host: int = 64) -> tuple[RadixCache, CachePublisher]:
    pub = CachePublisher()
    return RadixCache(SlotAllocator(gpu), observer=pub, host_capacity=host), pub


def _load_back(cache: RadixCache, toks: list[int]) -> None:
    m = cache.match_prefix(toks)
    assert m.host_len == len(toks)
    cache.lock(m.node)
    loaded = cache.load_host(m)
    assert loaded is not None and loaded.length == len(toks)
    cache.unlock(loaded.node)


def test_evicted_to_host_stays_published_as_host_and_a_load_makes_it_gpu_again() -> None:
    cache, pub = _tiered()
    a = list(range(40))  # 2 whole blocks, 8 tokens over
    ha = block_hashes(a)
    cache.insert(a, _slots(cache, 40))
    assert pub.drain() == CacheDelta(False, sorted(ha), [], [])
    assert cache.evict(40) == 40  # GPU -> host: the blocks move tier, nothing is removed
    assert pub.drain() == CacheDelta(False, [], [], sorted(ha))
    assert pub.held() == set(ha) == pub.host_held() and pub.host_block_count == 2
    _load_back(cache, a)  # host -> GPU: GPU-resident again (the host copy stays)
    assert pub.drain() == CacheDelta(False, sorted(ha), [], [])
    assert pub.host_held() == set()
    cache.evict(40)  # back to the host: no copy needed, the blocks move tier again
    assert pub.drain() == CacheDelta(False, [], [], sorted(ha))
    assert cache.host is not None and cache.host.evict(40) == 40  # the host's own LRU drops it
    assert pub.drain() == CacheDelta(False, [], sorted(ha), [])
    assert pub.block_count == 0


def test_tier_changes_between_drains_are_net() -> None:
    cache, pub = _tiered()
    a = list(range(32))
    ha = block_hashes(a)
    cache.insert(a, _slots(cache, 32))
    pub.drain()
    cache.evict(32)
    _load_back(cache, a)  # GPU -> host -> GPU before the flush: nothing to tell
    assert pub.drain() is None
    cache.evict(32)
    assert cache.host is not None
    cache.host.evict(32)  # GPU -> host -> gone: only the removal
    assert pub.drain() == CacheDelta(False, [], sorted(ha), [])
    b = list(range(100, 132))
    cache.insert(b, _slots(cache, 32))
    cache.evict(32)  # new and offloaded before the flush: new to subscribers, as host
    assert pub.drain() == CacheDelta(False, [], [], sorted(block_hashes(b)))


def test_no_room_on_the_host_removes_and_a_held_prompt_stays_gpu() -> None:
    cache, pub = _tiered(gpu=64, host=16)
    a = list(range(32))  # 32 tokens do not fit a 16-token host tier
    cache.insert(a, _slots(cache, 32))
    pub.drain()
    cache.evict(32)
    assert pub.drain() == CacheDelta(False, [], sorted(block_hashes(a)), [])
    b = list(range(200, 216))
    hb = block_hashes(b)
    pub.hold(hb)  # a live request's prompt: GPU-resident however the tree holds it
    cache.insert(b, _slots(cache, 16))
    cache.evict(16)  # saved to the host, but the hold keeps it published as GPU
    assert pub.drain() == CacheDelta(False, hb, [], [])
    pub.release(hb)  # the request ended: the block is the host tier's now
    assert pub.drain() == CacheDelta(False, [], [], hb)


def test_a_snapshot_keeps_the_drained_tiers() -> None:
    cache, pub = _tiered()
    a = list(range(32))
    ha = block_hashes(a)
    cache.insert(a, _slots(cache, 32))
    pub.drain()
    early = dict.fromkeys(ha, GPU)
    cache.evict(32)  # offloaded, not yet drained
    late: dict[int, int] = {}
    apply(late, pub.snapshot())
    assert late == early  # the drained state: still on the GPU
    delta = pub.drain()
    apply(late, delta)
    apply(early, delta)
    assert late == early == dict.fromkeys(ha, HOST)
    cache.flush()  # both tiers dropped
    delta = pub.drain()
    assert delta == CacheDelta(False, [], sorted(ha), [])
    apply(late, delta)
    assert late == {}
