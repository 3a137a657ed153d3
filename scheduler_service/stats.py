"""Scheduler counters, and the snapshot of them and of the KV pool that GetStats reports."""

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


@dataclass(frozen=True)
class SchedulerSnapshot:
    """The scheduler's counters and KV pool at one instant (GetStats)."""

    queue_length: int
    running_requests: int
    kv_capacity: int
    kv_free: int
    kv_evictable: int
    kv_locked: int
    kv_request_owned: int
    cache_hit_rate: float
    prompt_tokens: int
    cached_prompt_tokens: int
    generated_tokens: int
    evicted_tokens: int
    finished_requests: int
    retractions: int
    steps: int
    radix_seconds: float
    mask_wait_seconds: float
    jump_forwards: int
    jump_forward_tokens: int
    # Host tier (issue 31): all 0 without one.
    host_kv_capacity: int = 0
    host_kv_used: int = 0
    host_hit_tokens: int = 0
    host_saved_tokens: int = 0
    host_loaded_tokens: int = 0
    host_evicted_tokens: int = 0

    @property
    def token_usage(self) -> float:
        cap = self.kv_capacity
        return 1 - self.kv_free / cap if cap else 0.0
