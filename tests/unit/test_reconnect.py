"""The shared reconnect loop (services/reconnect.py): delays double from 0.1 s to a 2 s cap after
failed attempts and restart after a clean one; with `pause_after_success` off a lost session is
retried at once. A fake wait records the delays: nothing sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from services.reconnect import reconnect_forever


class Done(Exception):
    """Ends the loop once the scripted attempts run out."""


def run_script(outcomes: list[bool], **kw: object) -> list[object]:
    """Drive reconnect_forever through `outcomes`; the log interleaves attempts and waits."""
    log: list[object] = []
    script: Iterator[bool] = iter(outcomes)

    async def attempt() -> bool:
        try:
            ok = next(script)
        except StopIteration:
            raise Done from None
        log.append("ok" if ok else "fail")
        return ok

    async def wait(seconds: float) -> None:
        log.append(round(seconds, 6))

    with pytest.raises(Done):
        asyncio.run(reconnect_forever(attempt, wait=wait, **kw))  # type: ignore[arg-type]
    return log


def test_failures_double_the_delay_up_to_the_cap() -> None:
    log = run_script([False] * 7)
    assert [x for x in log if x != "fail"] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_a_clean_attempt_restarts_the_delay_and_still_pauses() -> None:
    # A peer that accepts and at once ends the stream must not be retried in a tight loop.
    log = run_script([False, False, False, True, False, True, True])
    assert log == [
        *("fail", 0.1, "fail", 0.2, "fail", 0.4),
        *("ok", 0.1, "fail", 0.2),
        *("ok", 0.1, "ok", 0.1),
    ]


def test_without_pause_after_success_a_lost_session_is_retried_at_once() -> None:
    # The scheduler's model link: a session that connected and was lost reconnects at once;
    # the first failed connect after it waits first_s again.
    log = run_script([False, False, True, True, False, False], pause_after_success=False)
    assert log == ["fail", 0.1, "fail", 0.2, "ok", "ok", "fail", 0.1, "fail", 0.2]


def test_custom_bounds() -> None:
    log = run_script([False] * 4, first_s=0.5, max_s=1.5)
    assert [x for x in log if x != "fail"] == [0.5, 1.0, 1.5, 1.5]


@pytest.mark.parametrize(("first_s", "max_s"), [(0.0, 2.0), (3.0, 2.0), (-1.0, 1.0)])
def test_bounds_are_checked(first_s: float, max_s: float) -> None:
    async def attempt() -> bool:
        raise AssertionError("must not be called")

    with pytest.raises(ValueError, match="0 < first_s <= max_s"):
        asyncio.run(reconnect_forever(attempt, first_s=first_s, max_s=max_s))
