"""Choosing running requests to retract when decode needs more KV slots than exist.

Admission reserves only an *estimate* of future decode tokens (``new_token_ratio``), so
sometimes the running batch outgrows ``free + evictable``. Then some requests go back to the
waiting queue with their tokens so far (prompt + output); their KV becomes evictable cache, so
if memory frees up before it is evicted they resume with a cache hit.

Victim order (as SGLang): fewest generated tokens first (least decode work lost, and their
prompts are the most likely to still be cached when they come back), then the longest remaining
output (most future demand), then the longest prompt (frees the most), then the most recently
admitted (latest in ``running``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar


class RunningLike(Protocol):
    """What retraction and decode reservation need from a running request."""

    @property
    def output_len(self) -> int: ...

    @property
    def prompt_len(self) -> int: ...

    @property
    def max_new_tokens(self) -> int: ...


R = TypeVar("R", bound=RunningLike)


def retraction_order(running: Sequence[R]) -> list[R]:
    """``running`` sorted victims-first (see the module docstring for the key)."""
    keyed = sorted(
        range(len(running)),
        key=lambda i: (
            running[i].output_len,
            -(running[i].max_new_tokens - running[i].output_len),
            -running[i].prompt_len,
            -i,
        ),
    )
    return [running[i] for i in keyed]


def default_freed(r: RunningLike) -> int:
    """Estimated slots a retraction returns: all of the request's KV becomes free or evictable.

    An over-estimate when part of its prefix is shared with requests that keep running (that
    part stays locked); callers re-check with real numbers after retracting.
    """
    return r.prompt_len + r.output_len


def plan_retraction(
    running: Sequence[R],
    needed: int,
    *,
    per_request_need: int = 1,
    freed: Callable[[R], int] | None = None,
    keep: int = 1,
) -> list[R]:
    """Requests to retract, victims first, so that ``needed`` more slots become usable.

    ``needed`` is the shortfall: slots the next decode step needs beyond ``free + evictable``.
    Each victim is credited ``freed(victim)`` (default :func:`default_freed`) plus
    ``per_request_need`` (the decode slot it no longer needs). Stops as soon as the credit
    covers ``needed``; never returns more than ``len(running) - keep`` requests, so the caller
    must handle a shortfall that remains (e.g. abort the last request with an error). Pure: the
    caller does the retracting.
    """
    if needed <= 0 or not running:
        return []
    est = freed if freed is not None else default_freed
    limit = max(len(running) - keep, 0)
    out: list[R] = []
    credit = 0
    for r in retraction_order(running):
        if credit >= needed or len(out) >= limit:
            break
        out.append(r)
        credit += est(r) + per_request_need
    return out
