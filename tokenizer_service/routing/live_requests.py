"""The front door's record of every live request: what it submitted and the output the
scheduler has delivered so far (pure bookkeeping, no I/O).

When the scheduler is lost, nothing here is failed: once a new scheduler session opens, every
unfinished request is submitted again as a continuation (`SubmitRequest.output_ids` = its output
so far; same key, seed and sampling, so the remaining budget, min_new_tokens and seeded
sampling positions follow from len(output_ids), and a constrained request's matcher replays the
output). Stop strings live in the request's own stream state, which does not move.

Invariant: `output` is exactly the token list the client has: the output it resumed with
(`submit.output_ids`) plus what the request's queue has been given (rollbacks applied), so a
continuation, on the same replica or another one, never duplicates or skips a token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixmesh_wire.pb import api_pb2, scheduler_pb2
from tokenizer_service.routing.deltas import Update, fold, unpack_events
from tokenizer_service.routing.inbox import Inbox


@dataclass
class LiveRequest:
    submit: scheduler_pb2.SubmitRequest
    queue: Inbox
    output: list[int] = field(default_factory=list)
    ended: bool = False  # its final update (finish or error) is in the queue
    got_prompt_logprobs: bool = False

    def __post_init__(self) -> None:
        # A client's resumed request starts with the output it already has: a continuation
        # must carry those tokens too, not only the ones delivered since.
        if not self.output:
            self.output = list(self.submit.output_ids)

    def apply(self, u: Update) -> None:
        if u.rollback:
            del self.output[len(self.output) - u.rollback :]
        self.output.extend(u.token_ids)
        ex = u.extras
        if ex is not None:
            if ex.prompt_logprobs:
                self.got_prompt_logprobs = True
            if ex.error_code or ex.finish_reason != api_pb2.FINISH_REASON_UNSPECIFIED:
                self.ended = True

    def continuation(self) -> scheduler_pb2.SubmitRequest:
        """The submission that continues it on a new scheduler session."""
        msg = scheduler_pb2.SubmitRequest()
        msg.CopyFrom(self.submit)
        del msg.output_ids[:]
        msg.output_ids.extend(self.output)
        if self.got_prompt_logprobs:  # delivered once; a re-prefill must not repeat them
            msg.logprobs.ClearField("prompt_logprobs_from")
        return msg


class LiveTable:
    """Live requests by session key, in submission order."""

    def __init__(self) -> None:
        self.by_key: dict[int, LiveRequest] = {}

    def __len__(self) -> int:
        return len(self.by_key)

    def __contains__(self, key: int) -> bool:
        return key in self.by_key

    def add(self, live: LiveRequest) -> None:
        self.by_key[live.submit.key] = live

    def get(self, key: int) -> LiveRequest | None:
        return self.by_key.get(key)

    def remove(self, key: int) -> LiveRequest | None:
        return self.by_key.pop(key, None)

    def deliver(self, key: int, u: Update) -> None:
        live = self.by_key.get(key)
        if live is not None and not live.ended:
            live.apply(u)
            live.queue.put_nowait(u)

    def deliver_message(self, msg: scheduler_pb2.SchedulerMessage) -> None:
        """Every request's part of one scheduler message, in order. The common message (a
        token or a few per request, no jump-forward drop) goes token by token straight into
        the inboxes, without an `Update` per request (a stream that has not taken its last
        one gets the token appended to it); a request's extras follow its tokens as their own
        update. A message with a drop is folded per request first (`deltas.fold`)."""
        keys, events = unpack_events(msg)
        if events and min(events) < 0:  # a jump-forward drop: rare
            for key, u in fold(keys, events, msg.extras).items():
                self.deliver(key, u)
            return
        by_key = self.by_key
        for key, token in zip(keys, events, strict=True):
            live = by_key.get(key)
            if live is not None and not live.ended:
                live.output.append(token)
                live.queue.put_token(token)
        for ex in msg.extras:
            u = Update()
            u.extras = ex
            self.deliver(ex.key, u)

    def continuations(self) -> list[scheduler_pb2.SubmitRequest]:
        return [lv.continuation() for lv in self.by_key.values() if not lv.ended]

    def fail_all(self, error: Exception) -> None:
        for live in self.by_key.values():
            if not live.ended:
                live.ended = True
                live.queue.put_nowait(error)
        self.by_key.clear()
