"""Reconnect with backoff: the one loop behind every link that keeps a session to a peer open
(the front door's scheduler link, the scheduler's model and grammar links).

A link gives `reconnect_forever` an `attempt`: one session from connect to loss, including what
the loss means for the link's requests. The attempt returns True when it got through cleanly
(connected, or ended without a connection error) and False when it failed. The delay before the
next attempt starts at `first_s` and doubles up to `max_s`; a True attempt sets it back to
`first_s`. `wait` is how the link waits (asyncio.sleep, or a wait that also wakes for aborts);
tests pass a fake one, so the backoff is checked without sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import NoReturn

FIRST_S = 0.1  # first delay after a failed attempt
MAX_S = 2.0  # cap: a peer that comes back is found within about two seconds


async def reconnect_forever(
    attempt: Callable[[], Awaitable[bool]],
    *,
    wait: Callable[[float], Awaitable[object]] = asyncio.sleep,
    first_s: float = FIRST_S,
    max_s: float = MAX_S,
    pause_after_success: bool = True,
) -> NoReturn:
    """Run `attempt` until cancelled. After a False attempt: wait the delay, then double it.
    After a True one: the delay restarts at `first_s`, and unless `pause_after_success` is off
    (a lost session is then retried at once) the link waits it before the next attempt, so a
    peer that accepts and at once ends the stream is never retried in a tight loop."""
    if not 0 < first_s <= max_s:
        raise ValueError(f"reconnect delays must satisfy 0 < first_s <= max_s: {first_s}, {max_s}")
    delay = first_s
    while True:
        ok = await attempt()
        if ok:
            delay = first_s
            if not pause_after_success:
                continue
        await wait(delay)
        delay = min(delay * 2, max_s)
