"""Unpacks one SchedulerMessage (packed per-session step output) into one `Update` per request.

Events arrive as two parallel int32 arrays (request key, event): an event >= 0 appends a token,
< 0 drops the last -event tokens (jump-forward). Folding them per request keeps their order:
a drop first cancels tokens of the same message, and only the rest reaches tokens already
delivered (`rollback`). The request's `DeltaExtras` (logprobs, finish, error, ...) follows its
events of the same message.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixmesh_wire.packing import unpack_i32
from radixmesh_wire.pb import scheduler_pb2


class Update:
    """What one request got from one message: drop `rollback` delivered tokens, then append
    `token_ids`, then apply `extras` (None for the common plain-token case)."""

    __slots__ = ("token_ids", "rollback", "extras")

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.rollback = 0
        self.extras: scheduler_pb2.DeltaExtras | None = None

    def drop(self, n: int) -> None:
        mine = min(n, len(self.token_ids))
        del self.token_ids[len(self.token_ids) - mine :]
        self.rollback += n - mine


def unpack_message(msg: scheduler_pb2.SchedulerMessage) -> dict[int, Update]:
    """Request key -> its update, for every request the message mentions."""
    keys, events = unpack_events(msg)
    return fold(keys, events, msg.extras)


def unpack_events(msg: scheduler_pb2.SchedulerMessage) -> tuple[list[int], list[int]]:
    """The message's parallel (request key, event) arrays."""
    keys = unpack_i32(msg.keys)
    events = unpack_i32(msg.events)
    if len(keys) != len(events):
        raise ValueError(f"scheduler message: {len(keys)} keys but {len(events)} events")
    return keys, events


def fold(
    keys: list[int], events: list[int], extras: Iterable[scheduler_pb2.DeltaExtras]
) -> dict[int, Update]:
    """The events and extras of one message folded per request, in their order."""
    updates: dict[int, Update] = {}
    for key, ev in zip(keys, events, strict=True):
        u = updates.get(key)
        if u is None:
            u = updates[key] = Update()
        if ev >= 0:
            u.token_ids.append(ev)
        else:
            u.drop(-ev)
    for ex in extras:
        u = updates.get(ex.key)
        if u is None:
            u = updates[ex.key] = Update()
        u.extras = ex
    return updates
