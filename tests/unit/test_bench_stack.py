"""The benches' one stack starter (radixmesh_bench/stack.py) with a fake launcher: `running`
stops every service also when the start-up fails, and `restart_scheduler` replaces only the
scheduler, killing one still draining after its wait (the scheduler's shutdown grace outlasts
it while the front door's session stays open)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from radixmesh_bench import stack
from services.launcher import ServiceSpec


class FakeProc:
    def __init__(self, drains: bool) -> None:
        self.drains = drains  # exits on SIGTERM within the wait
        self.events: list[str] = []

    def terminate(self) -> None:
        self.events.append("terminate")

    def kill(self) -> None:
        self.events.append("kill")

    def wait(self, timeout: float | None = None) -> int:
        self.events.append(f"wait {timeout}")
        if timeout is not None and not self.drains:
            raise subprocess.TimeoutExpired("scheduler", timeout)
        return 0


class FakeLauncher:
    def __init__(self, drains: bool = True, ready_fails: bool = False) -> None:
        self.specs = {
            "scheduler": ServiceSpec("scheduler", "scheduler_service", 2, ["--old"]),
            "tokenizer": ServiceSpec("tokenizer", "tokenizer_service", 1, []),
        }
        self.procs: dict[str, Any] = {"scheduler": FakeProc(drains)}
        self.ready_fails = ready_fails
        self.events: list[str] = []

    def start_all(self) -> None:
        self.events.append("start_all")

    def stop_all(self) -> None:
        self.events.append("stop_all")

    def start(self, name: str) -> None:
        self.events.append(f"start {name} {self.specs[name].args}")

    async def wait_ready(self, timeout: float, names: list[str] | None = None) -> None:
        self.events.append(f"wait_ready {timeout} {names}")
        if self.ready_fails:
            raise RuntimeError("model exited during start-up")


@pytest.fixture(autouse=True)
def front_door_saw_it_go(monkeypatch: pytest.MonkeyPatch) -> None:
    async def not_ready(address: str) -> bool:
        return False

    monkeypatch.setattr(stack, "check_ready", not_ready)


def test_running_starts_waits_and_stops() -> None:
    fake = FakeLauncher()
    with stack.running(fake, timeout=7) as got:  # type: ignore[arg-type]
        assert got is fake
        assert fake.events == ["start_all", "wait_ready 7 None"]
    assert fake.events[-1] == "stop_all"


def test_running_stops_everything_when_the_start_up_fails() -> None:
    fake = FakeLauncher(ready_fails=True)
    with pytest.raises(RuntimeError, match="start-up"), stack.running(fake):  # type: ignore[arg-type]
        pytest.fail("must not be reached")
    assert fake.events == ["start_all", "wait_ready 600.0 None", "stop_all"]


def test_restart_replaces_only_the_scheduler() -> None:
    fake = FakeLauncher(drains=True)
    stack.restart_scheduler(fake, ["--radix", "off"], timeout=9)  # type: ignore[arg-type]
    assert fake.procs["scheduler"].events == ["terminate", "wait 30.0"]
    assert fake.events == [
        "start scheduler ['--radix', 'off']",
        "wait_ready 9 ['scheduler', 'tokenizer']",
    ]


def test_a_scheduler_still_draining_is_killed_after_the_wait() -> None:
    fake = FakeLauncher(drains=False)
    stack.restart_scheduler(fake, ["--new"], stop_wait_s=5)  # type: ignore[arg-type]
    assert fake.procs["scheduler"].events == ["terminate", "wait 5", "kill", "wait None"]
    assert fake.events[0] == "start scheduler ['--new']"
