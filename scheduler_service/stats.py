"""Scheduler counters, reported through GetStats (and later /metrics)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerStats:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    finished_requests: int = 0
    retractions: int = 0
    steps: int = 0
    step_seconds: float = 0.0  # scheduler CPU time building and applying steps
    mask_wait_seconds: float = 0.0  # time steps waited for grammar masks (mask stall)
    jump_forward_tokens: int = 0  # tokens appended by jump-forward instead of decoding
    jump_forwards: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
