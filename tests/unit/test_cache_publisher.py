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
from scheduler_service.cache.publisher import CacheDelta, CachePublisher
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


def apply(held: set[int], delta: CacheDelta | None) -> None:
    """What a front door does with a CacheEvents message."""
    if delta is None:
        return
    if delta.reset:
        held.clear()
    held.update(delta.added)
    held.difference_update(delta.removed)


class Running:
    def __init__(self, toks: list[int], slots: list[int], node: object, cached: int) -> None:
        self.toks, self.slots, self.node, self.cached = toks, slots, node, cached


class PublisherMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pub = CachePublisher()
        self.alloc = SlotAllocator(CAPACITY, debug=True)
        self.cache = RadixCache(self.alloc, observer=self.pub)
        self.owned: list[list[int]] = []
        self.locks: list[object] = []
        self.running: list[Running] = []
        self.subscribers: list[set[int]] = []
        self.holds: list[list[int]] = []  # live requests' prompt blocks

    def expected(self) -> set[int]:
        """Every cached prefix of a whole number of blocks, hashed from scratch, and every
        block a live request holds."""
        prefixes = self.cache.debug_prefix_map()
        tree = {block_hashes(p)[-1] for p in prefixes if len(p) % BLOCK_TOKENS == 0}
        return tree.union(*self.holds)

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
        held: set[int] = set()
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
        self.pub.check_integrity(self.cache.debug_paths())
        assert self.pub.held() == self.expected()
        assert self.pub.block_count == len(self.pub.held())


TestPublisherMachine = PublisherMachine.TestCase
TestPublisherMachine.settings = SETTINGS


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
    early = set(block_hashes(old))  # a session open since before
    cache.evict(32)
    brief = list(range(500, 516))
    cache.insert(brief, _slots(cache, 16))
    late: set[int] = set()
    apply(late, pub.snapshot())  # a session opening between these changes and their flush
    assert late == early
    cache.evict(16)  # `brief` leaves again before the flush: the drain never mentions it
    new = list(range(600, 616))
    cache.insert(new, _slots(cache, 16))
    delta = pub.drain()
    apply(late, delta)
    apply(early, delta)
    assert late == early == set(block_hashes(new)) == pub.held()


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
