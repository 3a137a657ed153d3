"""The front door's live-request record: continuations carry exactly the delivered output."""

from __future__ import annotations

from typing import Any

import pytest

from radixmesh_wire.pb import api_pb2, scheduler_pb2
from tokenizer_service.routing.deltas import Update
from tokenizer_service.routing.inbox import Inbox
from tokenizer_service.routing.live_requests import LiveRequest, LiveTable
from tokenizer_service.routing.scheduler_link import SchedulerLink, SchedulerLost


def _update(tokens: list[int], rollback: int = 0, **extras: object) -> Update:
    u = Update()
    u.token_ids = list(tokens)
    u.rollback = rollback
    if extras:
        u.extras = scheduler_pb2.DeltaExtras(**extras)  # type: ignore[arg-type]
    return u


def _live(key: int, rid: str = "r") -> LiveRequest:
    msg = scheduler_pb2.SubmitRequest(rid=rid, key=key, input_ids=[5, 6, 7])
    msg.sampling.seed = 42
    msg.sampling.max_new_tokens = 10
    msg.logprobs.prompt_logprobs_from = 1
    return LiveRequest(msg, Inbox())


def test_continuation_applies_rollbacks_and_keeps_everything_else() -> None:
    t = LiveTable()
    t.add(_live(3))
    t.deliver(3, _update([10, 11, 12]))
    t.deliver(3, _update([20, 21], rollback=2))  # jump-forward retokenized the tail
    (c,) = t.continuations()
    assert list(c.output_ids) == [10, 20, 21]
    assert (c.rid, c.key, list(c.input_ids)) == ("r", 3, [5, 6, 7])
    assert c.sampling.seed == 42 and c.sampling.max_new_tokens == 10  # budget: total - output
    assert c.logprobs.HasField("prompt_logprobs_from")  # not delivered yet: asked again
    live = t.get(3)
    assert live is not None and live.queue.qsize() == 2


def test_delivered_prompt_logprobs_are_not_asked_again() -> None:
    t = LiveTable()
    t.add(_live(1))
    lp = [api_pb2.TokenLogprob(token_id=6, logprob=-1.0)]
    t.deliver(1, _update([9], key=1, prompt_logprobs=lp))
    (c,) = t.continuations()
    assert not c.logprobs.HasField("prompt_logprobs_from") and list(c.output_ids) == [9]


def test_ended_requests_are_not_resubmitted_and_get_nothing_more() -> None:
    t = LiveTable()
    t.add(_live(1, "a"))
    t.add(_live(2, "b"))
    t.deliver(1, _update([4], key=1, finish_reason=api_pb2.FINISH_REASON_LENGTH))
    t.deliver(2, _update([], key=2, error_code=8, error_message="full"))
    t.deliver(1, _update([5]))
    assert t.continuations() == []
    a = t.get(1)
    assert a is not None and a.output == [4] and a.queue.qsize() == 1


def test_held_requests_wait_then_resubmit_in_order() -> None:
    link = SchedulerLink("127.0.0.1:1", hold_s=60)
    q = link.submit(scheduler_pb2.SubmitRequest(rid="x"))
    assert link.out.qsize() == 0 and q.qsize() == 0  # held: nothing sent, nothing failed
    assert [m.rid for m in link.live.continuations()] == ["x"]


def test_held_too_long_is_refused_with_a_message() -> None:
    link = SchedulerLink("127.0.0.1:1", hold_s=0)
    link.down_since = 0.0
    try:
        link.submit(scheduler_pb2.SubmitRequest(rid="x"))
    except SchedulerLost as exc:
        assert "unreachable for more than 0 s" in str(exc)
    else:
        raise AssertionError("a request was held past the bound")


def _message(keys: list[int], events: list[int], extras: list[Any]) -> Any:
    from radixmesh_wire.packing import pack_i32

    return scheduler_pb2.SchedulerMessage(
        keys=pack_i32(keys), events=pack_i32(events), extras=extras
    )


def _taken(t: LiveTable, key: int) -> list[tuple[list[int], int, bool]]:
    live = t.get(key)
    assert live is not None
    return [(u.token_ids, u.rollback, u.extras is not None) for u in live.queue.items]  # type: ignore[union-attr]


def test_a_message_reaches_the_inboxes_token_by_token_in_order() -> None:
    """Three steps' messages for requests 1 and 2 (2 finishes in the last, 3 is not live):
    each request's inbox holds ONE update of its tokens, then its extras (same tokens and
    outputs as folding each message per request first)."""
    t = LiveTable()
    t.add(_live(1, "a"))
    t.add(_live(2, "b"))
    fin = scheduler_pb2.DeltaExtras(key=2, finish_reason=api_pb2.FINISH_REASON_LENGTH)
    t.deliver_message(_message([1, 2, 3], [10, 20, 30], []))
    t.deliver_message(_message([2, 1, 1], [21, 11, 12], []))  # two tokens for 1 in one step
    t.deliver_message(_message([1, 2], [13, 22], [fin]))
    t.deliver_message(_message([2], [23], []))  # after its finish: nothing more
    assert _taken(t, 1) == [([10, 11, 12, 13], 0, False)]
    assert _taken(t, 2) == [([20, 21, 22], 0, False), ([], 0, True)]
    a, b = t.get(1), t.get(2)
    assert a is not None and a.output == [10, 11, 12, 13]
    assert b is not None and b.output == [20, 21, 22] and b.ended


def test_a_message_with_a_drop_is_folded_per_request_first() -> None:
    t = LiveTable()
    t.add(_live(1))
    t.deliver_message(_message([1, 1], [10, 11], []))
    t.deliver_message(_message([1, 1, 1], [12, -3, 20], []))  # drops 12, 11, 10 delivered
    live = t.get(1)
    assert live is not None and live.output == [20]
    assert _taken(t, 1) == [([10, 11], 0, False), ([20], 2, False)]


def test_one_update_object_per_request_while_its_stream_has_not_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """100 requests, 3 steps not yet taken: 100 `Update`s built (one per request), not 300
    (one per request per message), nor a dict per message."""
    made = 0
    init = Update.__init__

    def counted(self: Update) -> None:
        nonlocal made
        made += 1
        init(self)

    monkeypatch.setattr(Update, "__init__", counted)
    t = LiveTable()
    for k in range(1, 101):
        t.add(_live(k, f"r{k}"))
    keys = list(range(1, 101))
    for step in range(3):
        t.deliver_message(_message(keys, [step] * 100, []))
    assert made == 100
    assert all(_taken(t, k) == [([0, 1, 2], 0, False)] for k in keys)
