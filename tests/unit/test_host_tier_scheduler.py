"""The host KV tier through the real scheduler loop (issue 31), against a recording fake model
service: eviction sends a save in the step that reuses the slots (under write-through the
finished request's save comes first, and eviction copies nothing), a returning prefix is loaded
back in the step that admits it (into exactly its prefix slots) and the request's ADMIT goes
out in the next step (load-ahead), and a model-service restart forgets the host tier with the
GPU tier."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from radixmesh_wire.step_ops import StepOps, StepOutcome, WorkerInfo
from scheduler_service.config import SchedulerConfig
from scheduler_service.request import Request, SamplingSpec
from scheduler_service.scheduler import Scheduler
from scheduler_service.sessions.outbox import Batch

GPU, HOST = 20, 64


class RecordingLink:
    """Answers every step at once (each sampling row gets token 7) and keeps the steps; its
    model service has ``gpu`` KV slots and ``host`` host-tier slots."""

    def __init__(self, gpu: int = GPU, host: int = HOST) -> None:
        self.closed = asyncio.Event()
        self.sessions = 0
        self.steps: list[StepOps] = []
        self.gpu, self.host = gpu, host

    @property
    def connected(self) -> bool:
        return self.sessions > 0 and not self.closed.is_set()

    async def connect(self) -> WorkerInfo:
        self.sessions += 1
        self.closed = asyncio.Event()
        return WorkerInfo("fake", self.gpu, 64, 100, False, (2,), "cpu", host_kv_capacity=self.host)

    def send(self, ops: StepOps) -> asyncio.Future[StepOutcome]:
        self.steps.append(ops)
        handles = [a.handle for a in ops.admits if a.sample]
        handles += [e.handle for e in ops.extends if e.sample] + list(ops.decode_handles)
        fut: asyncio.Future[StepOutcome] = asyncio.get_running_loop().create_future()
        fut.set_result(StepOutcome(ops.step_id, handles, [7] * len(handles), [0.0] * len(handles)))
        return fut

    async def close(self) -> None:
        self.closed.set()


class Health:
    async def set_ready(self, ready: bool, reason: str) -> None:
        pass


async def _until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll a condition with a deadline (never a bare sleep as synchronisation)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


def _req(rid: str, key: int, prompt: list[int]) -> Request:
    spec = SamplingSpec(temperature=0, max_new_tokens=3, ignore_eos=True)
    return Request(rid=rid, session="s", prompt=prompt, spec=spec, eos_ids=frozenset(), key=key)


@pytest.mark.parametrize("write", ["write_back", "write_through"])
def test_save_on_eviction_load_on_hit_and_restart_forgets_the_host_tier(write: str) -> None:
    a = list(range(10, 20))
    b = list(range(30, 40))
    again = a + [7, 7, 7, 50]  # A's prompt and answer, and one more token

    async def scenario() -> tuple[Scheduler, RecordingLink, dict[str, int]]:
        cfg = SchedulerConfig(
            host_kv_tokens=HOST, debug_invariants=True, protect_ms=0, host_tier_write=write
        )
        sched = Scheduler(cfg)
        link = RecordingLink()
        sched.model.link = link  # type: ignore[assignment]
        out: list[Batch] = []
        sched.sinks["s"] = out.append
        task = asyncio.create_task(sched.model.run(Health()))  # type: ignore[arg-type]
        await _until(lambda: link.connected)

        def done(key: int) -> bool:
            return any(ex.key == key and ex.finish for bt in out for ex in bt.extras)

        for key, prompt in ((1, a), (2, b), (3, again)):
            sched.submit(_req(f"r{key}", key, prompt))
            await _until(lambda k=key: done(k))  # type: ignore[misc]
        snap = sched.snapshot()
        assert snap is not None
        before = {"hit": snap.host_hit_tokens, "used": snap.host_kv_used}
        link.closed.set()  # the model service restarts
        await _until(lambda: link.sessions == 2 and link.connected)
        task.cancel()
        return sched, link, before

    sched, link, before = asyncio.run(scenario())
    saves = [c for s in link.steps for c in s.copies if c.to_host]
    loads = [(i, c) for i, s in enumerate(link.steps) for c in s.copies if not c.to_host]
    assert saves, "B's admission evicted A: its KV must be saved, not dropped"
    assert len(loads) == 1
    i, load = loads[0]
    # Load-ahead: the step carrying the load has no row of r3 (its forward pass runs beside
    # the load); r3's ADMIT, reading the loaded prefix, is in the very next step.
    assert not [x for x in link.steps[i].admits if x.rid == "r3"]
    (admit,) = [x for x in link.steps[i + 1].admits if x.rid == "r3"]
    assert load.dst == admit.prefix_slots[len(admit.prefix_slots) - len(load.dst) :]
    assert len(admit.prefix_slots) == 12  # A's prompt and its first two answer tokens
    saved_to = {h for c in saves for h in c.dst}
    assert set(load.src) <= saved_to  # loaded from where A was saved
    assert before["hit"] == len(load.dst) and before["used"] > 0
    st = sched.st
    assert st is not None
    host = getattr(st.cache, "host", None)
    assert host is not None and host.held == 0 and host.queued == 0
    assert host.allocator.free_count == HOST and st.cache.free_size == GPU
    # Write-through copied every finished path when it finished, so eviction copied nothing.
    through = host.stats.written_through_tokens
    if write == "write_through":
        assert through == host.stats.saved_tokens > 0
    else:
        assert through == 0
