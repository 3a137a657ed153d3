"""The scheduler -> front door output path: Outbox (scheduler) -> SchedulerMessage (wire) ->
Update per request (front door), including jump-forward drops and rare extras."""

from __future__ import annotations

import pytest

from radixmesh_wire.packing import pack_i32
from radixmesh_wire.pb import api_pb2, scheduler_pb2
from scheduler_service.links.frontend import batch_to_proto
from scheduler_service.sessions.outbox import Outbox
from tokenizer_service.routing.deltas import unpack_message
from tokenizer_service.routing.inbox import Inbox
from tokenizer_service.routing.scheduler_link import _MAX_KEY, SchedulerLink


def roundtrip(box: Outbox) -> dict:
    wire = scheduler_pb2.SchedulerMessage.FromString(
        batch_to_proto(box.drain()).SerializeToString()
    )
    return unpack_message(wire)


def test_plain_tokens_travel_without_extras() -> None:
    box = Outbox("s")
    for step in range(3):
        for key in (1, 2, 7):
            box.keys.append(key)
            box.events.append(100 * key + step)
    msg = batch_to_proto(box.drain())
    assert not msg.extras and len(msg.keys) == len(msg.events) == 9 * 4
    got = unpack_message(msg)
    assert {k: u.token_ids for k, u in got.items()} == {
        1: [100, 101, 102],
        2: [200, 201, 202],
        7: [700, 701, 702],
    }
    assert all(u.rollback == 0 and u.extras is None for u in got.values())
    assert not box  # drained


def test_rollback_first_cancels_this_messages_tokens_then_delivered_ones() -> None:
    box = Outbox("s")
    box.tokens(3, [10, 11])
    box.rollback(3, 5)  # drops 11, 10 and three already delivered tokens
    box.tokens(3, [20, 21, 22])
    box.rollback(4, 2)
    box.tokens(4, [40])
    box.rollback(5, 0)  # no-op: nothing recorded
    got = roundtrip(box)
    assert (got[3].rollback, got[3].token_ids) == (3, [20, 21, 22])
    assert (got[4].rollback, got[4].token_ids) == (2, [40])
    assert 5 not in got


def test_extras_only_for_requests_that_have_them() -> None:
    box = Outbox("s")
    box.tokens(1, [5])
    box.tokens(2, [6])
    ex = box.extra(2, "r2")
    ex.logprobs.append((6, -0.5, [6, 9], [-0.5, -1.25]))
    ex.finish = "stop"
    ex.matched_stop_token = 2
    ex.cached_tokens = 0  # 0 cached is still reported
    ex.prompt_logprobs.append((4, -2.0))
    err = box.extra(3, "r3")
    err.error_code, err.error_message = 8, "queue full"
    assert box.extra(2, "r2") is ex  # one extra per request per flush
    got = roundtrip(box)
    assert got[1].extras is None and got[1].token_ids == [5]
    e2 = got[2].extras
    assert e2 is not None and got[2].token_ids == [6]
    assert e2.finish_reason == api_pb2.FINISH_REASON_STOP
    assert e2.HasField("matched_stop_token") and e2.matched_stop_token == 2
    assert e2.HasField("cached_tokens") and e2.cached_tokens == 0
    assert [(lp.token_id, lp.logprob) for lp in e2.logprobs] == [(6, -0.5)]
    assert [(t.token_id, t.logprob) for t in e2.logprobs[0].top] == [(6, -0.5), (9, -1.25)]
    assert [(lp.token_id, lp.logprob) for lp in e2.prompt_logprobs] == [(4, -2.0)]
    e3 = got[3].extras
    assert e3 is not None and got[3].token_ids == []
    assert (e3.error_code, e3.error_message) == (8, "queue full")
    assert not e3.HasField("matched_stop_token") and not e3.HasField("cached_tokens")
    assert e3.finish_reason == api_pb2.FINISH_REASON_UNSPECIFIED


def test_ended_marks_finish_or_error() -> None:
    box = Outbox("s")
    assert not box.extra(1, "a").ended
    box.extra(2, "b").finish = "abort"
    box.extra(3, "c").error_code = 14
    assert [e.ended for e in box.drain().extras] == [False, True, True]


def test_mismatched_arrays_are_rejected() -> None:
    msg = scheduler_pb2.SchedulerMessage(keys=pack_i32([1, 2]), events=pack_i32([3]))
    with pytest.raises(ValueError, match="2 keys but 1 events"):
        unpack_message(msg)


def test_front_door_keys_count_up_wrap_and_skip_live_ones() -> None:
    link = SchedulerLink("127.0.0.1:1")
    link.connected.set()
    msgs = [scheduler_pb2.SubmitRequest(rid=f"r{i}") for i in range(3)]
    for m in msgs:
        link.submit(m)
    assert [m.key for m in msgs] == [1, 2, 3]
    link.done("r1", 2)
    assert set(link.live.by_key) == {1, 3} and set(link.keys) == {"r0", "r2"}
    link._last_key = _MAX_KEY - 1
    late = [scheduler_pb2.SubmitRequest(rid=f"w{i}") for i in range(3)]
    for m in late:
        link.submit(m)
    assert [m.key for m in late] == [_MAX_KEY, 2, 4]  # 1 and 3 are still live
    link.abort("w1", 2)
    assert 2 not in link.live and "w1" not in link.keys
    sent = [link.out.get_nowait() for _ in range(link.out.qsize())]
    assert [m.WhichOneof("kind") for m in sent] == ["submit"] * 6 + ["abort"]
    live = link.live.get(1)
    assert live is not None and isinstance(live.queue, Inbox)
