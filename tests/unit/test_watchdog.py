"""The liveness watchdog: stuck loops and dead tasks turn liveness NOT_SERVING; idle is fine."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2

from services.server import LIVENESS, Health
from services.watchdog import Progress, Watchdog


def test_idle_is_never_stuck_busy_is_after_the_limit() -> None:
    p = Progress("loop", stall_s=5.0)
    assert p.stalled(p.last + 100) is None  # no work under way
    p.begin()
    assert p.stalled(p.last + 4) is None
    assert p.stalled(p.last + 6) == "loop made no progress for 6 s (limit 5 s)"
    p.beat()
    assert p.stalled(p.last + 1) is None
    p.end()
    assert p.active == 0 and p.stalled(p.last + 100) is None


def test_nested_work_keeps_the_oldest_start() -> None:
    p = Progress("steps", stall_s=1.0)
    p.begin()
    t0 = p.last
    p.begin()  # a second step queued behind the first: not progress
    assert p.last == t0 and p.active == 2
    p.end()
    assert p.active == 1 and p.last >= t0


async def _check(h: Health, name: str) -> int:
    resp = await h.servicer.Check(health_pb2.HealthCheckRequest(service=name), None)
    return int(resp.status)


def test_dead_task_then_stall_turn_liveness_not_serving() -> None:
    async def main() -> None:
        h = Health()
        await h.start()
        dog = Watchdog(interval_s=0.01)

        async def boom() -> None:
            raise RuntimeError("loop crashed")

        t = asyncio.create_task(boom())
        dog.task("scheduler loop", t)
        runner = asyncio.create_task(dog.run(h))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if await _check(h, LIVENESS) == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
        assert await _check(h, LIVENESS) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await _check(h, "") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert "RuntimeError('loop crashed')" in (dog.problem(0.0) or "")
        runner.cancel()

    asyncio.run(main())


async def _until(h: Health, status: int, polls: int = 3000) -> None:
    """Poll liveness until it reads `status`: a wait for the event (bounded in polls), not a
    bound on how fast it comes."""
    for _ in range(polls):
        if await _check(h, LIVENESS) == status:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"liveness never became {status}")


def test_stuck_loop_recovers_when_it_progresses() -> None:
    async def main() -> None:
        h = Health()
        await h.start()
        dog = Watchdog(interval_s=0.01)
        p = dog.progress("model step", stall_s=0.05)
        p.begin()
        runner = asyncio.create_task(dog.run(h))
        await _until(h, health_pb2.HealthCheckResponse.NOT_SERVING)
        p.end()
        await _until(h, health_pb2.HealthCheckResponse.SERVING)
        runner.cancel()

    asyncio.run(main())
