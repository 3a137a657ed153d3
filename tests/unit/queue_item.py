"""A waiting request as the policy and the prefill adder see it (the fields they read), for
tests that drive those pure modules without the scheduler's Request."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_service.cache.prefix_cache import MatchResult


@dataclass(eq=False)
class Item:
    tokens: list[int]
    arrival: int
    max_new_tokens: int = 0
    prefix_limit: int | None = None
    match: MatchResult | None = None
