"""Requests submitted before the scheduler's first model session.

Until the model service has answered once, nothing can validate a request (no vocab size,
context window or KV pool yet), yet a front door resubmits its live requests the moment a
restarted scheduler accepts its session. Refusing them would turn a scheduler restart into
failed requests, so they wait here, bounded like the hold after a model loss: at most
`max_count` requests and `hold_s` seconds from the scheduler's start. On the first model
session each is submitted for real (validated then, failing alone if it is invalid).
"""

from __future__ import annotations

import time

from scheduler_service.request import Request
from scheduler_service.status import Status
from scheduler_service.submit_validation import SubmitError, check_unique


class StartupHold:
    def __init__(self, max_count: int, hold_s: float) -> None:
        self.max_count = max_count
        self.hold_s = hold_s
        self.since = time.monotonic()
        self.reqs: dict[str, Request] = {}  # by rid, in arrival order
        self.open = True  # False once the first model session took the held requests

    def __len__(self) -> int:
        return len(self.reqs)

    def expired(self) -> bool:
        return time.monotonic() - self.since > self.hold_s

    def add(self, req: Request) -> None:
        if self.expired():
            raise SubmitError(
                Status.UNAVAILABLE,
                f"the model service has not connected in {self.hold_s:g} s since the scheduler"
                " started (--model-hold-s); retry later",
            )
        check_unique(
            req, self.reqs, {r.key for r in self.reqs.values() if r.session == req.session}
        )
        if len(self.reqs) >= self.max_count:
            raise SubmitError(
                Status.RESOURCE_EXHAUSTED,
                f"{self.max_count} requests are already waiting for the model service to"
                " connect; retry later",
            )
        self.reqs[req.rid] = req

    def remove(self, rid: str, session: str | None = None) -> bool:
        req = self.reqs.get(rid)
        if req is None or (session is not None and req.session != session):
            return False
        del self.reqs[rid]
        return True

    def drop_session(self, session: str) -> None:
        for rid in [rid for rid, r in self.reqs.items() if r.session == session]:
            del self.reqs[rid]

    def take(self) -> list[Request]:
        out = list(self.reqs.values())
        self.reqs.clear()
        return out
