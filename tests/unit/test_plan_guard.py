"""PlanGuard (model_service/attention/flashinfer.py): a flashinfer wrapper plans again only
after the GPU has read its previous plan's pinned buffer (the event recorded after it)."""

from __future__ import annotations

from typing import Any

from model_service.attention.flashinfer import PlanGuard


class Ev:
    def __init__(self, log: list[str], n: int) -> None:
        self.log, self.n = log, n

    def record(self) -> None:
        self.log.append(f"record {self.n}")

    def synchronize(self) -> None:
        self.log.append(f"wait {self.n}")


class Wrapper:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def plan(self, *args: Any, **kw: Any) -> None:
        self.log.append(f"plan {self.name} {args} {kw}")


def test_a_wrapper_waits_for_its_own_previous_plan_only() -> None:
    log: list[str] = []
    made = iter(range(100))
    guard = PlanGuard(lambda: Ev(log, next(made)))
    prefill, decode = Wrapper("prefill", log), Wrapper("decode", log)
    guard.plan(prefill, 1, causal=True)
    guard.plan(decode, 2)
    guard.plan(prefill, 3, causal=True)
    guard.plan(decode, 4)
    assert log == [
        "plan prefill (1,) {'causal': True}",
        "record 0",
        "plan decode (2,) {}",
        "record 1",
        "wait 0",  # the prefill buffer's last copy, before it is rewritten
        "plan prefill (3,) {'causal': True}",
        "record 2",
        "wait 1",
        "plan decode (4,) {}",
        "record 3",
    ]
