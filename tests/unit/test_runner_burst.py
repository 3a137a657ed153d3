"""The worker's `step_burst` accounting (`step_bursts.StepBursts`, held by the ModelRunner):
a pause longer than BURST_IDLE_S ends a burst, and the step after the pause is the first of
the next burst (the load test and the stack bench read per-step figures from these lines)."""

from __future__ import annotations

from typing import Any

import pytest

from model_service import step_bursts
from model_service.runner import BURST_IDLE_S, InFlight
from model_service.step_bursts import StepBursts


def _record(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The step_burst lines logged from now on, as dicts."""
    logged: list[dict[str, Any]] = []

    class Recorder:
        def info(self, event: str, **kw: Any) -> None:
            logged.append({"event": event, **kw})

    monkeypatch.setattr(step_bursts, "log", Recorder())
    return logged


def test_a_pause_ends_a_burst_and_the_next_step_starts_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logged = _record(monkeypatch)
    r = StepBursts()
    t = 100.0
    for burst, steps in enumerate((3, 5, 2)):
        if burst:
            t += BURST_IDLE_S + 0.1  # the pause that ends the previous burst
        for i in range(steps):
            r.account(InFlight(i, t), t + 0.010)  # 10 ms inside the step
            t += 0.012  # 2 ms between steps
    r.log_burst()
    assert [e["steps"] for e in logged] == [3, 5, 2]
    for e in logged:
        assert e["busy_ms_per_step"] == pytest.approx(10.0, abs=1e-6)
        assert e["between_ms_per_step"] == pytest.approx(2.0, abs=1e-6)


def test_a_burst_reports_what_its_steps_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """rows_per_step, positions_per_step and graphed_fraction are the means over the burst's
    steps (the TP and stack runs read them to tell big eager steps from graphed decodes)."""
    logged = _record(monkeypatch)
    r = StepBursts()
    t = 10.0
    steps = [(4, 40, False), (4, 4, True), (6, 6, True), (2, 2, True)]  # rows, positions, graph
    for i, (rows, pos, graphed) in enumerate(steps):
        fl = InFlight(i, t, handles=list(range(rows)), tokens_in=pos, graphed=graphed)
        r.account(fl, t + 0.001)
        t += 0.002
    r.log_burst()
    (e,) = logged
    assert e["rows_per_step"] == 4.0
    assert e["positions_per_step"] == 13.0
    assert e["graphed_fraction"] == 0.75
