"""The client's resume bookkeeping: what a continuation sends and when retrying stops."""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest
import radixmesh.retry
from radixmesh.api import build_request
from radixmesh.retry import NO_RETRY, Resumable, RetryPolicy

from radixmesh_wire.pb import api_pb2


def test_continuation_keeps_id_and_seed_and_sends_received_ids() -> None:
    call = Resumable(build_request("hi", max_new_tokens=9), RetryPolicy(), None)
    first, _ = call.next_request()
    assert first.request_id and first.sampling.HasField("seed")  # picked once, client-side
    assert list(first.resume_output_ids) == []
    call.on_chunk(api_pb2.GenerateChunk(token_ids=[1, 2, 3]))
    call.on_chunk(api_pb2.GenerateChunk(token_ids=[7, 8], rollback=2))  # jump-forward
    again, _ = call.next_request()
    assert list(again.resume_output_ids) == [1, 7, 8]
    assert (again.request_id, again.sampling.seed) == (first.request_id, first.sampling.seed)
    assert again.sampling.max_new_tokens == 9  # the budget still counts the resumed ids


def test_backoff_doubles_and_only_unavailable_or_a_reset_stream_is_retried() -> None:
    call = Resumable(build_request("hi"), RetryPolicy(initial_backoff_s=0.1), None)
    call.next_request()
    assert call.retry_after(grpc.StatusCode.UNAVAILABLE) == 0.1
    call.next_request()
    assert call.retry_after(grpc.StatusCode.INTERNAL, "Received RST_STREAM with error code 2")
    assert call.retry_after(grpc.StatusCode.INTERNAL, "model step failed") is None
    assert call.retry_after(grpc.StatusCode.INVALID_ARGUMENT) is None


def test_opt_out_and_deadline_stop_retrying() -> None:
    call = Resumable(build_request("hi"), NO_RETRY, None)
    call.next_request()
    assert call.retry_after(grpc.StatusCode.UNAVAILABLE) is None
    assert not call.req.request_id  # nothing picked when it never resends
    short = Resumable(build_request("hi"), RetryPolicy(initial_backoff_s=5), timeout=1.0)
    _, timeout = short.next_request()
    assert timeout is not None and timeout <= 1.0
    assert short.retry_after(grpc.StatusCode.UNAVAILABLE) is None  # would pass the deadline


def test_retry_budget_is_no_deadline() -> None:
    """`total_s` bounds retrying, not a healthy stream: without a call timeout no attempt gets
    a gRPC deadline (a long generation under load once failed at 120 s with
    DEADLINE_EXCEEDED), and past the budget a broken stream is no longer retried."""
    call = Resumable(build_request("hi"), RetryPolicy(total_s=0.0), timeout=None)
    _, timeout = call.next_request()
    assert timeout is None
    assert call.retry_after(grpc.StatusCode.UNAVAILABLE) is None


class FakeClock:
    """A monotonic clock the test moves by hand (no sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The retry module's `time.monotonic` is the fake clock (as it was before `clock=`)."""
    fake = FakeClock()
    monkeypatch.setattr(radixmesh.retry, "time", SimpleNamespace(monotonic=fake))
    return fake


def test_retry_budget_counts_from_the_last_delivered_token(clock: FakeClock) -> None:
    """Issue 26 item 4: a stream older than `total_s` that keeps delivering is still resumed
    when the front door dies; the budget runs from its last token, not from the call's start."""
    policy = RetryPolicy(total_s=120.0, initial_backoff_s=0.5)
    call = Resumable(build_request("hi"), policy, None)
    call.next_request()
    for step in range(30):  # 300 s of tokens, one every 10 s
        clock.now += 10.0
        call.on_chunk(api_pb2.GenerateChunk(token_ids=[step]))
    clock.now += 1.0  # the front door dies 301 s into the call, 1 s after the last token
    assert call.retry_after(grpc.StatusCode.UNAVAILABLE) == 0.5
    resumed, _ = call.next_request()
    assert list(resumed.resume_output_ids) == list(range(30))
    # No token for 117 s more: 118 s + the 1.0 s backoff is still inside the 120 s budget.
    clock.now += 117.0
    assert call.retry_after(grpc.StatusCode.UNAVAILABLE) == 1.0
    call.next_request()
    clock.now += 2.5  # 120.5 s after the last token: the outage has outlived the budget
    assert call.retry_after(grpc.StatusCode.UNAVAILABLE) is None


def test_attempts_and_backoff_start_over_after_progress_but_no_retry_stays_off(
    clock: FakeClock,
) -> None:
    policy = RetryPolicy(max_attempts=2, initial_backoff_s=0.1)
    call = Resumable(build_request("hi"), policy, None)
    call.next_request()
    assert call.retry_after(grpc.StatusCode.UNAVAILABLE) == 0.1
    call.next_request()
    call.on_chunk(api_pb2.GenerateChunk(token_ids=[5]))  # the second attempt delivered
    assert call.retry_after(grpc.StatusCode.UNAVAILABLE) == 0.1  # backoff restarted
    call.next_request()
    assert call.retry_after(grpc.StatusCode.UNAVAILABLE) is None  # 2 attempts since progress
    never = Resumable(build_request("hi"), NO_RETRY, None, clock=FakeClock())
    never.next_request()
    never.on_chunk(api_pb2.GenerateChunk(token_ids=[1]))
    assert never.retry_after(grpc.StatusCode.UNAVAILABLE) is None


def test_an_injected_clock_drives_the_budget() -> None:
    clock = FakeClock()
    call = Resumable(build_request("hi"), RetryPolicy(total_s=10.0), None, clock=clock)
    call.next_request()
    clock.now += 9.9
    assert call.retry_after(grpc.StatusCode.UNAVAILABLE) is None  # 9.9 + 0.2 backoff >= 10
