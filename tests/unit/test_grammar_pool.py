"""A scheduler with several grammar services (issue 16): matchers placed on the least loaded
service, a step's rows gathered from every owner, and a lost service's requests re-bound on
another with replay. Fake links stand in for the gRPC ones; each fake keeps the tokens every
matcher accepted and answers a row that spells them out, so a test can prove that the matcher
that answered a row had seen exactly the request's output."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest

from radixmesh_wire.mask_rows import EncodedRow, MaskEncoding
from radixmesh_wire.mask_step_ops import Bind, MaskStepOutcome, MaskStepPlan
from radixmesh_wire.packing import pack_i32, unpack_i32
from radixmesh_wire.step_ops import StepOutcome
from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.prefix_cache import make_prefix_cache
from scheduler_service.config import SchedulerConfig
from scheduler_service.grammar.metrics import grammar_readings
from scheduler_service.grammar.placement import Placement
from scheduler_service.grammar.pool import GrammarPool
from scheduler_service.grammar.step_masks import StepMasks
from scheduler_service.planner.batch_builder import BatchBuilder
from scheduler_service.planner.output_processor import apply_result
from scheduler_service.planner.policy import SchedulePolicy
from scheduler_service.request import Request, SamplingSpec
from scheduler_service.scheduler import Scheduler
from scheduler_service.state import SchedState
from scheduler_service.status import GrammarLost, GrammarUnavailable, Status


class FakeGrammarLink:
    """One grammar service: matchers are token lists; a row's data is the tokens its matcher
    accepted. `hold`: step futures wait for `answer()` (to see concurrency)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.up = asyncio.Event()
        self.on_up: Callable[[], None] = lambda: None
        self.on_down: Callable[[], None] = lambda: None
        self.matchers: dict[int, list[int]] = {}
        self.plans: list[MaskStepPlan] = []
        self.compiled: list[tuple[str, str]] = []
        self.hold = False
        self.held: list[tuple[asyncio.Future[MaskStepOutcome], MaskStepOutcome]] = []
        self.unreachable = False  # compile answers GrammarLost
        self.garble = False  # the next step's reply cannot be read (the session stays up)
        self._stop = asyncio.Event()

    async def run(self) -> None:
        self.connect()
        await self._stop.wait()

    async def close(self) -> None:
        self.up.clear()

    def connect(self) -> None:
        self.matchers.clear()  # a new session knows no matchers
        self.on_up()
        self.up.set()

    def kill(self) -> None:
        self.up.clear()
        for fut, _ in self.held:
            if not fut.done():
                fut.set_exception(GrammarLost(f"{self.address} lost"))
        self.held.clear()
        self.on_down()

    async def compile(self, kind: str, text: str) -> tuple[bool, str]:
        if self.unreachable or not self.up.is_set():
            raise GrammarLost(f"{self.address} unreachable")
        self.compiled.append((kind, text))
        return True, ""

    def step(self, plan: MaskStepPlan) -> asyncio.Future[MaskStepOutcome]:
        fut: asyncio.Future[MaskStepOutcome] = asyncio.get_running_loop().create_future()
        if not self.up.is_set():
            fut.set_exception(GrammarLost(f"{self.address} is not connected"))
            return fut
        self.plans.append(plan)
        for h in plan.releases:
            self.matchers.pop(h, None)
        for b in plan.binds:
            assert b.handle not in self.matchers, f"{self.address}: {b.handle} already bound"
            self.matchers[b.handle] = list(b.replay)
        for h, n in plan.rollbacks:
            del self.matchers[h][len(self.matchers[h]) - n :]
        for h, toks in plan.accepts.items():
            self.matchers[h].extend(toks)
        out = MaskStepOutcome(plan.step_id)
        for h in plan.want:
            out.rows[h] = EncodedRow(MaskEncoding.ALLOWED, pack_i32(self.matchers[h]))
        if self.garble:
            self.garble = False
            fut.set_exception(GrammarUnavailable("unreadable grammar reply"))
        elif self.hold:
            self.held.append((fut, out))
        else:
            fut.set_result(out)
        return fut

    def answer(self) -> None:
        for fut, out in self.held:
            fut.set_result(out)
        self.held.clear()


class Fakes:
    def __init__(self) -> None:
        self.links: dict[str, FakeGrammarLink] = {}

    def make(self, address: str) -> FakeGrammarLink:
        self.links[address] = FakeGrammarLink(address)
        return self.links[address]


async def _until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


async def _pool(addresses: list[str]) -> tuple[GrammarPool, Fakes]:
    fakes = Fakes()
    pool = GrammarPool(",".join(addresses), fakes.make)
    await pool.set_addresses(addresses)
    await _until(lambda: len(pool.connected()) == len(addresses))
    return pool, fakes


def _close(pool: GrammarPool) -> None:
    for task in pool._tasks.values():
        task.cancel()


def _bind(h: int, replay: list[int] | None = None, text: str = "[a-z]+") -> Bind:
    return Bind(h, "regex", text, replay or [])


# -- placement (pure) ---------------------------------------------------------------------------
def test_binds_go_to_the_least_loaded_service_and_operations_follow_their_owner() -> None:
    p = Placement()
    up = ["a", "b"]
    s = p.split(MaskStepPlan(1, binds=[_bind(h) for h in range(5)], want=[0, 1, 2, 3, 4]), up)
    assert {a: [b.handle for b in part.binds] for a, part in s.parts.items()} == {
        "a": [0, 2, 4],
        "b": [1, 3],
    }
    assert s.parts["a"].want == [0, 2, 4] and s.parts["b"].want == [1, 3]
    assert p.live == {"a": 3, "b": 2}
    # Releases, rollbacks, accepts and jumps go to the owner; a freed slot takes the next bind.
    s = p.split(
        MaskStepPlan(
            2,
            releases=[0, 2],
            binds=[_bind(7)],
            rollbacks=[(1, 1)],
            accepts={3: [5], 4: [6]},
            want=[1, 3, 4, 7],
            jump=[3, 7],
        ),
        up,
    )
    a, b = s.parts["a"], s.parts["b"]
    assert a.releases == [0, 2] and b.releases == []
    assert [x.handle for x in a.binds] == [7]  # a: 1 live after the releases, b: 2
    assert b.rollbacks == [(1, 1)] and a.accepts == {4: [6]} and b.accepts == {3: [5]}
    assert a.want == [4, 7] and a.jump == [7] and b.want == [1, 3] and b.jump == [3]
    assert not s.orphaned and not s.unplaced
    # Equal load: the service that compiled the grammar wins the tie.
    p2 = Placement()
    p2.compiled(("regex", "x"), "b")
    s = p2.split(MaskStepPlan(1, binds=[_bind(0, text="x")]), up)
    assert list(s.parts) == ["b"]


def test_a_dropped_service_orphans_its_rows_and_nothing_connected_leaves_binds_unplaced() -> None:
    p = Placement()
    p.split(MaskStepPlan(1, binds=[_bind(h) for h in range(4)]), ["a", "b"])
    assert sorted(p.drop("a")) == [0, 2]
    s = p.split(MaskStepPlan(2, releases=[0], accepts={0: [1], 1: [2]}, want=[0, 1, 2]), ["b"])
    assert list(s.parts) == ["b"]  # nothing for the lost service, not even the release
    assert s.parts["b"].accepts == {1: [2]} and s.orphaned == [0, 2]
    s = p.split(MaskStepPlan(3, binds=[_bind(9)], want=[9]), [])
    assert s.unplaced == [9] and s.orphaned == [9] and not s.parts


# -- the pool ---------------------------------------------------------------------------------
def test_a_step_goes_to_both_services_at_once_and_rows_come_back_in_order() -> None:
    asyncio.run(_test_a_step_goes_to_both_services_at_once_and_rows_come_back_in_order())


async def _test_a_step_goes_to_both_services_at_once_and_rows_come_back_in_order() -> None:
    pool, fakes = await _pool(["a:1", "b:2"])
    a, b = fakes.links["a:1"], fakes.links["b:2"]
    a.hold = b.hold = True
    fut = asyncio.ensure_future(
        pool.step(MaskStepPlan(1, binds=[_bind(h, [h]) for h in range(4)], want=[3, 2, 1, 0]))
    )
    await _until(lambda: len(a.held) == 1 and len(b.held) == 1)  # both sent before any answer
    b.answer()
    await asyncio.sleep(0)
    assert not fut.done()  # the step waits for the slowest service
    a.answer()
    got = await fut
    assert list(got.outcome.rows) == [3, 2, 1, 0] and got.lost == []
    assert {h: unpack_i32(r.data) for h, r in got.outcome.rows.items()} == {
        h: [h] for h in range(4)
    }
    assert a.matchers.keys() == {0, 2} and b.matchers.keys() == {1, 3}
    assert pool.rows_sent == {"a:1": 2, "b:2": 2}
    readings = {(r.short, r.labels): r.value for r in grammar_readings(pool)}
    assert readings[("grammar_services_connected", ())] == 2
    assert readings[("grammar_matchers", (("service", "a:1"),))] == 2
    assert readings[("grammar_mask_rows", (("service", "b:2"),))] == 2
    _close(pool)


def test_compiles_spread_and_skip_an_unreachable_service() -> None:
    asyncio.run(_test_compiles_spread_and_skip_an_unreachable_service())


async def _test_compiles_spread_and_skip_an_unreachable_service() -> None:
    pool, fakes = await _pool(["a:1", "b:2"])
    a, b = fakes.links["a:1"], fakes.links["b:2"]
    for i in range(4):
        assert await pool.compile("regex", f"r{i}") == (True, "")
    assert len(a.compiled) == 2 and len(b.compiled) == 2
    a.unreachable = True
    for i in range(3):
        assert await pool.compile("regex", f"s{i}") == (True, "")
    assert len(b.compiled) == 5
    # None reachable: wait (bounded), then UNAVAILABLE with the reason.
    b.unreachable = True
    with pytest.raises(GrammarUnavailable, match="unreachable"):
        await pool.compile("regex", "t", wait_s=0.05)
    _close(pool)


def test_a_removed_address_gives_its_matchers_back_and_an_added_one_takes_binds() -> None:
    asyncio.run(_test_a_removed_address_gives_its_matchers_back_and_an_added_one_takes_binds())


async def _test_a_removed_address_gives_its_matchers_back_and_an_added_one_takes_binds() -> None:
    pool, fakes = await _pool(["a:1", "b:2"])
    lost: list[int] = []
    pool.on_lost = lost.extend
    await pool.step(MaskStepPlan(1, binds=[_bind(h) for h in range(4)]))
    await pool.set_addresses(["b:2"])
    assert sorted(lost) == [0, 2] and pool.connected() == ["b:2"]
    await pool.set_addresses(["b:2", "c:3"])
    await _until(lambda: len(pool.connected()) == 2)
    await pool.step(MaskStepPlan(2, binds=[_bind(h) for h in (0, 2)]))
    assert fakes.links["c:3"].matchers.keys() == {0, 2}  # b holds 2: c, with 0, takes both
    _close(pool)


def test_an_unreadable_reply_releases_the_matchers_there_before_they_are_bound_again() -> None:
    asyncio.run(_unreadable())


async def _unreadable() -> None:
    pool, fakes = await _pool(["a:1", "b:2"])
    a = fakes.links["a:1"]
    lost: list[int] = []
    pool.on_lost = lost.extend
    await pool.step(MaskStepPlan(1, binds=[_bind(h) for h in range(4)]))
    a.garble = True
    got = await pool.step(MaskStepPlan(2, accepts={0: [5], 1: [6]}, want=[0, 1, 2, 3]))
    assert got.lost == [0, 2] and sorted(got.outcome.rows) == [1, 3]
    assert sorted(lost) == [0, 2] and a.up.is_set()
    # The re-binds (with replay) land after a's stale matchers are released: no ALREADY_BOUND.
    await pool.step(MaskStepPlan(3, binds=[_bind(0, [5]), _bind(2)], want=[0, 2]))
    assert a.plans[-1].releases == [0, 2]
    _close(pool)


def test_a_file_spec_is_followed_while_running(tmp_path: Path) -> None:
    asyncio.run(_file_spec(tmp_path / "grammars"))


async def _file_spec(path: Path) -> None:
    path.write_text("a:1\n")
    fakes = Fakes()
    pool = GrammarPool(f"file:{path}", fakes.make, interval_s=0.01)
    lost: list[int] = []
    pool.on_lost = lost.extend
    runner = asyncio.create_task(pool.run())
    await _until(lambda: pool.connected() == ["a:1"])
    path.write_text("a:1\nb:2  # added\n")
    await _until(lambda: sorted(pool.connected()) == ["a:1", "b:2"])
    await pool.step(MaskStepPlan(1, binds=[_bind(h) for h in range(4)]))
    path.write_text("b:2\n")
    await _until(lambda: pool.connected() == ["b:2"])
    assert sorted(lost) == [0, 2]
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    assert pool.links == {} and not pool.up.is_set()


# -- the scheduler's steps over two services ---------------------------------------------------
class Harness:
    """The scheduler's step path (BatchBuilder, StepMasks, apply_result) with the real
    re-bind hook, two fake grammar services and a model that samples `10 + step` per row."""

    def __init__(self, pool: GrammarPool) -> None:
        self.sched = Scheduler(SchedulerConfig(grammar_address="a:1,b:2", jump_forward="off"))
        self.st = st = SchedState(
            cache=make_prefix_cache("tree", SlotAllocator(1024)), context_length=512
        )
        self.sched.st = st
        pool.on_lost = self.sched._rebind_grammars
        self.pool = pool
        self.builder = BatchBuilder(self.sched.cfg, st, SchedulePolicy("fcfs"))
        self.failed: list[tuple[str, Status, str]] = []
        self.masks = StepMasks(self.sched.cfg, st, pool, self._fail)
        self.steps = 0
        self.rows_checked = 0

    def _fail(self, r: Request, code: Status, message: str) -> None:
        self.failed.append((r.rid, code, message))
        self.st.release(r, insert=False)

    def submit(self, rid: str, n: int) -> Request:
        r = Request(
            rid=rid,
            session="s",
            prompt=[1, 2, 3, len(self.st.waiting) + 4],
            spec=SamplingSpec(temperature=0, max_new_tokens=n),
            eos_ids=frozenset(),
            grammar=("regex", "[a-z]+"),
        )
        r.outbox = self.st.outbox("s")
        self.st.waiting.append(r)
        return r

    async def step(self) -> None:
        st = self.st
        st.grammar_up = self.pool.up.is_set()
        self.steps += 1
        plan = self.builder.build()
        await self.masks.before_send(plan)
        rows = dict(plan.ops.masks)
        skip: set[int] = set()
        if plan.ops.masks_follow:
            late = await self.masks.after_send(plan)
            rows.update(late.rows)
            skip = set(late.skip)
        sampled = [h for h in plan.sampling if h not in skip]
        for h in sampled:  # a constrained row samples only with a mask from a matcher that
            r = st.running[h]  # has accepted exactly the request's output so far
            assert unpack_i32(rows[h].data) == r.output, (r.rid, r.output)
            self.rows_checked += 1
        tok = 10 + self.steps
        apply_result(
            st,
            plan,
            StepOutcome(plan.ops.step_id, sampled, [tok] * len(sampled), [0.0] * len(sampled)),
        )


def test_a_lost_service_requests_are_rebound_on_the_other_with_replay() -> None:
    asyncio.run(_test_a_lost_service_requests_are_rebound_on_the_other_with_replay())


async def _test_a_lost_service_requests_are_rebound_on_the_other_with_replay() -> None:
    pool, fakes = await _pool(["a:1", "b:2"])
    a, b = fakes.links["a:1"], fakes.links["b:2"]
    h = Harness(pool)
    reqs = [h.submit(f"r{i}", 12) for i in range(4)]
    for _ in range(4):
        await h.step()
    assert len(a.matchers) == 2 and len(b.matchers) == 2  # spread 2/2
    on_a = [r for r in reqs if r.handle in a.matchers]
    a.kill()
    assert pool.connected() == ["b:2"]
    for _ in range(3):
        await h.step()
    # The lost ones now live on b, replayed: the rows b answered for them matched their output
    # (checked in every step), and they kept generating.
    assert b.matchers.keys() == {r.handle for r in reqs}
    assert any(
        bd.handle == on_a[0].handle and len(bd.replay) >= 3 for p in b.plans for bd in p.binds
    )
    # No service at all: constrained requests wait (no token, no failure) ...
    b.kill()
    before = [len(r.output) for r in reqs]
    for _ in range(3):
        await h.step()
    assert [len(r.output) for r in reqs] == before and not h.failed
    # ... and a service that comes back takes them all, with replay, to the end.
    a.connect()
    while any(r.handle >= 0 for r in reqs) and h.steps < 60:
        await h.step()
    assert [r.output for r in reqs] == [reqs[0].output] * 4 and len(reqs[0].output) == 12
    assert not h.failed and h.rows_checked >= 40
    assert h.st.stats.mask_wait_seconds > 0
    h.st.check_integrity()
    _close(pool)


def test_a_service_lost_mid_step_only_its_rows_wait() -> None:
    asyncio.run(_test_a_service_lost_mid_step_only_its_rows_wait())


async def _test_a_service_lost_mid_step_only_its_rows_wait() -> None:
    pool, fakes = await _pool(["a:1", "b:2"])
    a, b = fakes.links["a:1"], fakes.links["b:2"]
    h = Harness(pool)
    reqs = [h.submit(f"r{i}", 8) for i in range(4)]
    for _ in range(3):
        await h.step()
    a.hold = True  # the next step's part for a is in flight when a dies
    on_a = {r.rid for r in reqs if r.handle in a.matchers}
    step = asyncio.ensure_future(h.step())
    await _until(lambda: len(a.held) == 1)
    lengths = {r.rid: len(r.output) for r in reqs}
    a.kill()
    await step
    grew = {r.rid for r in reqs if len(r.output) > lengths[r.rid]}
    assert grew == {r.rid for r in reqs} - on_a  # b's rows sampled, a's waited
    while any(r.handle >= 0 for r in reqs) and h.steps < 40:
        await h.step()
    assert all(len(r.output) == 8 for r in reqs) and not h.failed
    assert b.matchers == {} or all(len(v) <= 8 for v in b.matchers.values())
    _close(pool)
