"""A failed step's host-tier copies (issue 31): the tree keeps no copy that step was to write.

The tree's bookkeeping changes when a copy is queued. When the model service refuses or fails
the step carrying it, the copy counts as not run (``PrefixCache.undo_copies``): a save's host
copy is dropped, a load's GPU residence is dropped, and so is whatever a later step's copy
made from them. Each test runs a simulated pool pair beside the tree (``Pools``: every cell
holds the token path whose KV it contains) that runs the copies of every step except the
failed one, and checks that every slot the tree holds contains its path's KV, that both
tiers' invariants hold, and that every slot is accounted for. The last test drives the real
scheduler loop against a fake model service that refuses a step carrying copies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from radixmesh_wire.step_ops import KVCopy, StepOps, StepOutcome
from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.host_tier import HostTier
from scheduler_service.cache.publisher import CachePublisher
from scheduler_service.cache.radix_cache import RadixCache
from scheduler_service.cache.radix_node import RadixNode
from scheduler_service.config import SchedulerConfig
from scheduler_service.metrics import host_tier_readings
from scheduler_service.planner.step_failure import fail_step
from scheduler_service.request import Phase, Request
from scheduler_service.scheduler import Scheduler
from scheduler_service.sessions.outbox import Batch
from tests.unit.test_host_tier import Pools
from tests.unit.test_host_tier_scheduler import Health, RecordingLink, _req, _until
from tests.unit.test_load_ahead_scheduler import DOC, _apply, _loads, _state
from tests.unit.test_load_ahead_scheduler import GPU as DOC_GPU
from tests.unit.test_load_ahead_scheduler import _req as _doc_req

GPU, HOST = 12, 16
A = [1, 2, 3, 4]


class Tiers:
    """A tree with a host tier, its simulated pools and numbered steps."""

    def __init__(self, write: str = "write_back") -> None:
        self.pub = CachePublisher()
        self.cache = RadixCache(
            SlotAllocator(GPU, debug=True), host_capacity=HOST, observer=self.pub, host_write=write
        )
        self.pools = Pools(GPU, HOST)
        self.step_id = 0
        self.readers: list[set[int]] = []

    @property
    def host(self) -> Any:
        assert self.cache.host is not None
        return self.cache.host

    def send(self, run: bool = True) -> list[KVCopy]:
        """The next step takes the queued copies; the model service runs them unless the
        step fails."""
        self.step_id += 1
        copies: list[KVCopy] = self.host.take_copies(self.step_id)
        if run:
            self.pools.run(copies)
        return copies

    def compute(self, toks: list[int], slots: list[int], start: int = 0) -> None:
        """A forward pass writes the KV of ``toks[start:]`` into ``slots``."""
        for i, s in enumerate(slots):
            self.pools.gpu[s] = tuple(toks[: start + i + 1])

    def cached(self, toks: list[int]) -> None:
        """A request computes all of ``toks`` and leaves them cached."""
        slots = self.cache.alloc(len(toks))
        assert slots is not None
        self.send()
        self.compute(toks, slots)
        self.cache.insert(toks, slots)

    def undo(self, step_id: int, release: list[Any] | None = None) -> int:
        """The scheduler's failure path: ``release`` holds the locks of the requests reading
        what the failed step's loads were to write."""

        def readers(bad: set[int]) -> None:
            self.readers.append(bad)
            for node in release or []:
                self.cache.unlock(node)

        return self.cache.undo_copies(step_id, readers)

    def check(self, owned: list[int] | None = None) -> None:
        """Both tiers' invariants, the event mirror, every slot accounted for, and every slot
        the tree holds contains its path's KV."""
        c = self.cache
        owned = owned or []
        c.check_integrity(len(owned), owned)
        self.pub.check_integrity(c.debug_paths(), c.debug_host_paths())
        assert c.free_size + c.evictable_size + c.locked_size + len(owned) == GPU
        assert self.host.allocator.free_count + self.host.held == HOST
        stack: list[tuple[RadixNode, tuple[int, ...]]] = [
            (n, ()) for n in c._root.children.values()
        ]
        while stack:
            node, above = stack.pop()
            paths = [above + tuple(node.key[: j + 1]) for j in range(len(node.key))]
            if node.value:
                assert [self.pools.gpu[s] for s in node.value] == paths, "garbage GPU KV"
            if node.host is not None:
                assert [self.pools.host[s] for s in node.host] == paths, "garbage host KV"
            stack.extend((ch, paths[-1]) for ch in node.children.values())


def _evict_a(t: Tiers, run: bool) -> int:
    """A is cached; a request for B takes the whole pool, which evicts A (write-back: its
    save rides on B's step). Returns that step's id."""
    t.cached(A)
    b = [9] * GPU
    slots = t.cache.alloc(GPU)
    assert slots is not None
    copies = t.send(run=run)
    assert [c.to_host for c in copies] == [True]
    if run:
        t.compute(b, slots)
    t.cache.free_slots(slots)  # B failed with its step, or left uncached
    return t.step_id


def _load_a(t: Tiers) -> tuple[Any, KVCopy]:
    """A was evicted to the host (its save ran); a request for A + [5] loads it back, in a
    step sent but not run. Returns the load's match (its node locked) and the load copy."""
    _evict_a(t, run=True)
    m = t.cache.match_prefix(A + [5])
    t.cache.lock(m.node)
    loaded = t.cache.load_host(m)
    assert loaded is not None
    (load,) = t.send(run=False)
    assert not load.to_host
    return loaded, load


def test_a_save_that_never_ran_leaves_no_host_copy_and_the_prefix_is_recomputed() -> None:
    t = Tiers()
    failed = _evict_a(t, run=False)
    assert t.cache.match_prefix(A + [5]).host_len == 4  # what the tree believed
    freed = t.undo(failed)
    t.check()
    m = t.cache.match_prefix(A + [5])
    assert (m.length, m.host_len) == (0, 0)  # recomputed, never loaded from garbage
    assert t.host.held == 0 and t.host.allocator.free_count == HOST and t.cache.free_size == GPU
    assert t.readers == []  # no load involved: no request reads anything of it
    assert freed == t.host.stats.undone_tokens == 4
    t.cached(A)  # recomputed, and evicted again: the new save runs and a hit loads it back
    t.cache.evict(4)
    t.send()
    m = t.cache.match_prefix(A + [5])
    t.cache.lock(m.node)
    loaded = t.cache.load_host(m)
    assert loaded is not None and loaded.length == 4
    t.send()
    t.check()


def test_a_write_through_save_that_never_ran_keeps_the_gpu_copy() -> None:
    t = Tiers("write_through")
    slots = t.cache.alloc(4)
    assert slots is not None
    t.send()
    t.compute(A, slots)
    t.cache.insert(A, slots)  # queues its write-through save
    assert t.host.held == 4
    (save,) = t.send(run=False)
    assert save.to_host
    freed = t.undo(t.step_id)
    t.check()
    m = t.cache.match_prefix(A + [5])
    assert (m.length, m.host_len) == (4, 0)  # still a GPU hit, with good KV
    assert t.host.held == 0 and t.host.allocator.free_count == HOST and freed == 4


def test_a_load_that_never_ran_gives_its_gpu_slots_back_and_the_host_copy_serves_again() -> None:
    t = Tiers()
    loaded, load = _load_a(t)
    # The scheduler fails the request admitted loading first (its lock goes), then undoes.
    t.cache.unlock(loaded.node)
    freed = t.undo(t.step_id)
    t.check()
    m = t.cache.match_prefix(A + [5])
    assert (m.length, m.host_len) == (0, 4)  # host-only again: no GPU hit on garbage
    assert t.cache.free_size == GPU and t.host.held == 4 and freed == 4
    assert t.readers == [set(load.dst)]
    t.cache.lock(m.node)
    again = t.cache.load_host(m)  # loaded again, by a step that runs
    assert again is not None
    t.send()
    t.check()
    t.cache.unlock(again.node)


def test_a_reader_admitted_in_the_next_step_is_released_and_nothing_is_left_of_the_load() -> None:
    """Overlap: the step after the failed one was built (and sent) before the failure came
    back. A request admitted in it reads the loaded prefix on the GPU, and the GPU node below
    it was cached from another request meanwhile: both leave the GPU."""
    t = Tiers()
    loaded, _ = _load_a(t)
    failed = t.step_id
    # Meanwhile a result came: a request that computed A itself leaves A + [6, 7] cached (its
    # duplicate of A freed); the next step admits a reader of A + [6] with a GPU hit.
    own = t.cache.alloc(6)
    assert own is not None
    t.compute(A + [6, 7], own)
    t.cache.insert(A + [6, 7], own)
    hit = t.cache.match_prefix(A + [6, 7, 8])
    assert hit.length == 6 and hit.slots[:4] == loaded.slots
    t.cache.lock(hit.node)
    t.send()
    t.cache.unlock(loaded.node)  # the loading request fails with the failed step
    freed = t.undo(failed, release=[hit.node])
    t.check()
    m = t.cache.match_prefix(A + [6, 7, 8])
    assert (m.length, m.host_len) == (0, 4)  # [6, 7] had no host copy: gone
    assert t.cache.free_size == GPU and t.host.held == 4 and freed == 6


def test_a_load_made_from_a_save_that_never_ran_is_undone_with_it() -> None:
    """Overlap: the save fails, and the next step (already sent) loads that host copy back."""
    t = Tiers()
    failed = _evict_a(t, run=False)
    m = t.cache.match_prefix(A + [5])
    t.cache.lock(m.node)
    loaded = t.cache.load_host(m)
    assert loaded is not None
    (load,) = t.send()  # it runs, and copies garbage onto the GPU
    freed = t.undo(failed, release=[loaded.node])
    t.check()
    m = t.cache.match_prefix(A + [5])
    assert (m.length, m.host_len) == (0, 0)
    assert t.cache.free_size == GPU and t.host.allocator.free_count == HOST and freed == 8
    assert t.readers == [set(load.dst)]


def test_only_the_failed_steps_copies_are_undone() -> None:
    t = Tiers()
    done = _evict_a(t, run=True)  # A saved by a step that ran
    t.cached([7, 7])
    t.send()
    assert t.undo(t.step_id) == 0  # a failed step without copies changes nothing
    assert t.undo(done + 1) == 0
    assert t.cache.match_prefix(A + [5]).host_len == 4
    t.check()


def test_the_slots_a_failed_step_spoils_follow_later_copies_in_order() -> None:
    """``HostTier.failed`` on copy batches as the step builder records them: the failed
    step's destinations, then every later copy from a spoiled slot spoils its destination and
    one from a good slot makes it good again; older steps are forgotten (their copies ran)."""
    host = HostTier(16, unlink=lambda n: None)
    host._sent.extend(
        [
            (4, [KVCopy(True, [0], [0])]),
            (5, [KVCopy(True, [0, 1], [3, 4]), KVCopy(False, [9], [2])]),  # the failed step
            (6, [KVCopy(False, [3, 8], [6, 7]), KVCopy(True, [2, 5], [9, 4])]),
        ]
    )
    host._copies.append(KVCopy(False, [9], [1]))  # queued for the next step
    assert host.failed(5) == ({1, 2, 6}, {3, 9})  # host 4 rewritten from good GPU slot 5
    assert host.failed(4) == (set(), set()) and host.failed(6) == ({1, 6, 7}, {9, 4})


# -- the scheduler's failure path ----------------------------------------------------------
def test_a_reader_admitted_after_a_failed_load_recomputes_and_the_loading_request_fails() -> None:
    """Overlap, through the step builder: step N loads DOC for r (admitted loading); N+1 is
    built before N's result and admits x with a GPU hit on the loaded prefix. N fails: r fails
    with it, x goes back to the queue (nothing it computed was used), DOC is host-only again,
    and x's next admission loads it again."""
    st, builder = _state()
    r = _doc_req("r", DOC + [5])
    st.waiting.append(r)
    plan = builder.build()
    loaded = _loads(plan)
    assert r.phase is Phase.LOADING and len(loaded) == len(DOC)
    x = _doc_req("x", DOC[:6] + [9])
    st.waiting.append(x)
    nxt = builder.build()
    (x_admit,) = [a for a in nxt.ops.admits if a.rid == "x"]
    assert x_admit.prefix_slots == loaded[:6]  # reads what the load was to write
    failed: list[str] = []

    def fail(req: Request, code: Any, message: str) -> None:
        failed.append(req.rid)
        st.release(req, insert=False)

    fail_step(st, plan, "StepError: refused", fail)
    assert failed == ["r"]
    assert st.waiting == [x] and x.handle < 0 and x.phase is Phase.WAITING
    st.check_integrity()
    cache = st.cache
    m = cache.match_prefix(DOC + [5])
    assert (m.length, m.host_len) == (0, len(DOC))  # host-only again: no GPU hit on garbage
    assert cache.free_size + cache.evictable_size == DOC_GPU and not st.running
    _apply(st, nxt)  # N+1's result: its rows belong to released incarnations
    again = builder.build()  # x is served from the host copy, by a new load
    assert x.phase is Phase.LOADING and x.kv_slots == _loads(again)


# -- through the scheduler loop --------------------------------------------------------------
SCHED_GPU, SCHED_HOST = 20, 64
TOKEN = 7  # every sampled token


class PoolLink(RecordingLink):
    """A fake model service on simulated pools: each step runs its copies in order, then its
    rows write their tokens' KV (every row samples ``TOKEN``). An ADMIT whose prefix slots do
    not hold its prompt's KV is recorded in ``garbage`` (its output would be wrong). The
    first step ``refuse`` picks is refused: nothing of it runs, as after the model service's
    checks, and its result is an error."""

    def __init__(self, prompts: dict[str, list[int]], refuse: Callable[[StepOps], bool]) -> None:
        super().__init__(SCHED_GPU, SCHED_HOST)
        self.prompts = prompts
        self.refuse: Callable[[StepOps], bool] | None = refuse
        self.refused: StepOps | None = None
        self.pools = Pools(SCHED_GPU, SCHED_HOST)
        self.paths: dict[int, list[int]] = {}  # handle -> its tokens with KV written
        self.garbage: set[str] = set()

    def _write(self, h: int, ids: list[int], slots: list[int]) -> None:
        path = self.paths[h]
        for t, s in zip(ids, slots, strict=True):
            path.append(t)
            self.pools.gpu[s] = tuple(path)

    def send(self, ops: StepOps) -> asyncio.Future[StepOutcome]:
        self.steps.append(ops)
        fut: asyncio.Future[StepOutcome] = asyncio.get_running_loop().create_future()
        if self.refuse is not None and self.refuse(ops):
            self.refuse, self.refused = None, ops
            fut.set_result(StepOutcome(ops.step_id, [], [], [], error="StepError: refused"))
            return fut
        for h in ops.releases:
            self.paths.pop(h, None)
        self.pools.run(ops.copies)
        for a in ops.admits:
            prompt = self.prompts[a.rid]
            n = len(a.prefix_slots)
            if [self.pools.gpu[s] for s in a.prefix_slots] != [
                tuple(prompt[: i + 1]) for i in range(n)
            ]:
                self.garbage.add(a.rid)
            self.paths[a.handle] = prompt[:n]
            self._write(a.handle, a.input_ids, a.slots)
        for e in ops.extends:
            self._write(e.handle, e.input_ids, e.slots)
        for h, s in zip(ops.decode_handles, ops.decode_slots, strict=True):
            self._write(h, [TOKEN], [s])
        handles = [a.handle for a in ops.admits if a.sample]
        handles += [e.handle for e in ops.extends if e.sample] + list(ops.decode_handles)
        n = len(handles)
        fut.set_result(StepOutcome(ops.step_id, handles, [TOKEN] * n, [0.0] * n))
        return fut


def _serve(
    prompts: dict[str, list[int]], refuse: Callable[[StepOps], bool]
) -> tuple[Scheduler, PoolLink, dict[str, Any]]:
    """Submit ``prompts`` one after another (each waits for the one before to end) to the real
    scheduler loop (overlap on, --debug-invariants) on a ``PoolLink``; returns how each ended
    (an error code, or "ok")."""

    async def scenario() -> tuple[Scheduler, PoolLink, dict[str, Any]]:
        cfg = SchedulerConfig(
            host_kv_tokens=SCHED_HOST, debug_invariants=True, protect_ms=0, overlap="on"
        )
        sched = Scheduler(cfg)
        link = PoolLink(prompts, refuse)
        sched.model.link = link  # type: ignore[assignment]
        out: list[Batch] = []
        sched.sinks["s"] = out.append
        task = asyncio.create_task(sched.model.run(Health()))  # type: ignore[arg-type]
        await _until(lambda: link.connected)
        ended: dict[str, Any] = {}

        def done(rid: str) -> bool:
            for bt in out:
                for ex in bt.extras:
                    if ex.rid == rid and ex.ended:
                        ended[rid] = ex.error_code or "ok"
            return rid in ended

        for key, (rid, prompt) in enumerate(prompts.items(), start=1):
            sched.submit(_req(rid, key, prompt))
            await _until(lambda r=rid: done(r))  # type: ignore[misc]
        await _until(lambda: sched.st is not None and not sched.st.running)
        task.cancel()
        return sched, link, ended

    return asyncio.run(scenario())


A10, B10 = list(range(10, 20)), list(range(30, 40))
AGAIN = A10 + [TOKEN] * 3 + [50]  # A's prompt and answer, and one more token


def _tier(sched: Scheduler) -> Any:
    st = sched.st
    assert st is not None
    st.check_integrity()
    host = getattr(st.cache, "host", None)
    assert host is not None
    return host


@pytest.mark.parametrize("refused", ["save", "load"])
def test_a_refused_step_with_copies_never_serves_their_kv(refused: str) -> None:
    """The step carrying A's save (B's admission evicts A), or the one carrying its load back
    (r3's admission), is refused. Before the fix the tree kept the copy that never ran: r3
    (save refused) or r4 (load refused) read garbage KV and ended "ok" with wrong output."""
    to_host = refused == "save"
    prompts = {"r1": A10, "r2": B10, "r3": AGAIN, "r4": AGAIN}
    sched, link, ended = _serve(prompts, lambda ops: any(c.to_host is to_host for c in ops.copies))
    assert link.refused is not None, "the scenario never sent the copy to refuse"
    ok = {rid for rid, how in ended.items() if how == "ok"}
    assert not link.garbage & ok, f"served from KV a refused step never copied: {link.garbage}"
    failed = {rid for rid, how in ended.items() if how != "ok"}
    assert failed == ({"r2"} if to_host else {"r3"})  # the refused step's requests, alone
    host = _tier(sched)
    assert host.stats.undone_tokens > 0
    readings = {r.short: r.value for r in host_tier_readings(host)}  # /metrics shows the same count
    assert readings["host_undone_tokens"] == host.stats.undone_tokens
    if to_host:  # the refused save's host slots are free again (it was A's leaf, host-only)
        assert host.stats.undone_tokens == sum(len(c.dst) for c in link.refused.copies)
    else:  # A stayed on the host and r4 loaded it again, by a step that ran
        loads = [c for s in link.steps for c in s.copies if not c.to_host]
        assert len(loads) == 2 and loads[0].src == loads[1].src
        assert "r4" in ok and "r4" not in link.garbage
    st = sched.st
    assert st is not None
    assert st.cache.free_size + st.cache.evictable_size == SCHED_GPU  # nothing locked or owned
    assert host.allocator.free_count + host.held == SCHED_HOST
