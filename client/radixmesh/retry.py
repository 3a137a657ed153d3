"""Retry policy for Generate: a stream broken with UNAVAILABLE (the front door restarting, or
the stack holding work past its bound) is resubmitted as a continuation.

A continuation is the same request (same request_id and seed: the client picks both when the
caller did not, so a resumed stream samples exactly what the broken one would have) plus
`resume_output_ids`, the token ids received so far. The server continues after them and streams
only what is new, so the caller sees each token once. Token ids, not text, are the ground
truth: text deltas are derived from them and a retokenized text prefix could differ.

Pure bookkeeping (no I/O), shared by the sync and asyncio clients.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from radixmesh_wire.pb import api_pb2


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff doubles from `initial_backoff_s` up to `max_backoff_s`; retrying stops after
    `max_attempts` attempts or once `total_s` seconds have passed, both counted from the last
    delivered token (from the call's start before the first one), or at the call's own
    timeout, whichever comes first. So `total_s` bounds an outage, never a stream: one that
    keeps delivering is resumed however old it is (a long generation under load can take
    minutes), and each token it delivers renews the budget and restarts the backoff. The
    call's own timeout is its deadline."""

    max_attempts: int = 20
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 2.0
    total_s: float = 120.0
    codes: frozenset[grpc.StatusCode] = field(
        default_factory=lambda: frozenset({grpc.StatusCode.UNAVAILABLE})
    )


NO_RETRY = RetryPolicy(max_attempts=1)

# A server killed mid-stream is sometimes reported as INTERNAL by the HTTP/2 layer (the stream
# was reset) rather than UNAVAILABLE; those are transport failures, retried like UNAVAILABLE.
# An INTERNAL the server itself answered is not retried.
_TRANSPORT_HINTS = ("RST_STREAM", "Stream removed", "Socket closed", "Connection reset")


def transport_failure(code: grpc.StatusCode, details: str) -> bool:
    return code == grpc.StatusCode.INTERNAL and any(h in details for h in _TRANSPORT_HINTS)


class Resumable:
    """One Generate call across attempts: the request to send next, and when to retry.

    `clock` (default `time.monotonic`) is injectable: the budget is testable without sleeping.
    Invariant: `_progress_at` is the time of the last delivered token (the call's start
    before any), and `_attempts_since_progress` counts the attempts made since then,
    including the one that delivered it: both retry bounds count from there."""

    def __init__(
        self,
        req: api_pb2.GenerateRequest,
        policy: RetryPolicy,
        timeout: float | None,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.policy = policy
        self.req = req
        if policy.max_attempts > 1:
            if not req.request_id:
                req.request_id = uuid.uuid4().hex
            if not req.sampling.HasField("seed"):
                req.sampling.seed = random.getrandbits(63)
        self.received: list[int] = []
        self.attempts = 0  # over the whole call
        self._clock = clock or time.monotonic
        self.start = self._clock()
        self.deadline = None if timeout is None else self.start + timeout  # the call's own
        self._progress_at = self.start
        self._attempts_since_progress = 0
        self._backoff = policy.initial_backoff_s

    @property
    def retry_until(self) -> float:
        """Past this time a broken stream is no longer resumed."""
        until = self._progress_at + self.policy.total_s
        return until if self.deadline is None else min(until, self.deadline)

    def next_request(self) -> tuple[api_pb2.GenerateRequest, float | None]:
        """The request of the next attempt and its gRPC timeout."""
        self.attempts += 1
        self._attempts_since_progress += 1
        req = self.req
        if self.received:
            req = api_pb2.GenerateRequest()
            req.CopyFrom(self.req)
            req.resume_output_ids.extend(self.received)
        left = None if self.deadline is None else max(self.deadline - self._clock(), 0.001)
        return req, left

    def on_chunk(self, chunk: api_pb2.GenerateChunk) -> None:
        if chunk.rollback:  # jump-forward retokenized ids we already hold
            del self.received[max(len(self.received) - chunk.rollback, 0) :]
        self.received.extend(chunk.token_ids)
        if chunk.token_ids:  # progress: the retry budget and the backoff start over
            self._progress_at = self._clock()
            self._attempts_since_progress = 1  # the attempt that delivered counts
            self._backoff = self.policy.initial_backoff_s

    def retry_after(self, code: grpc.StatusCode, details: str = "") -> float | None:
        """Seconds to wait before the next attempt, or None to give up with this error."""
        if transport_failure(code, details):
            code = grpc.StatusCode.UNAVAILABLE
        if code not in self.policy.codes:
            return None
        if self._attempts_since_progress >= self.policy.max_attempts:
            return None
        delay = self._backoff
        self._backoff = min(self._backoff * 2, self.policy.max_backoff_s)
        if self._clock() + delay >= self.retry_until:
            return None
        return delay
