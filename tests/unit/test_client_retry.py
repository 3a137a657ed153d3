"""The client's resume bookkeeping: what a continuation sends and when retrying stops."""

from __future__ import annotations

import grpc
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
