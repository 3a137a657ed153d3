"""Per-program request accounting (prompt, cached and generated tokens).

One `ProgramStats` is shared by a program's root state and all its forks, so its totals are
the program's totals. Kinds: "gen", "select" (choice scoring), "hint" (prefix-only warm-ups:
fork, select and run_batch hints). Thread-safe; totals cover the requests finished so far.

Every request recorded here is also added to `usage`, the backend's `token_usage` (SGLang's
running totals over all programs run on that backend), so one place counts both.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from radixmesh.lang.backend import Completion, TokenUsage


@dataclass(frozen=True)
class RequestRecord:
    kind: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


class ProgramStats:
    def __init__(self, usage: TokenUsage | None = None) -> None:
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []
        self._usage = usage

    def add(self, kind: str, completion: Completion) -> None:
        record = RequestRecord(
            kind, completion.prompt_tokens, completion.cached_tokens, completion.completion_tokens
        )
        with self._lock:
            self._records.append(record)
        if self._usage is not None:
            self._usage.add(completion)

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    def _sum(self, attr: str, kinds: tuple[str, ...] | None) -> int:
        return sum(getattr(r, attr) for r in self.requests if kinds is None or r.kind in kinds)

    def prompt_tokens(self, *kinds: str) -> int:
        """Prompt tokens of the requests of `kinds` (all kinds when none given)."""
        return self._sum("prompt_tokens", kinds or None)

    def cached_tokens(self, *kinds: str) -> int:
        return self._sum("cached_tokens", kinds or None)

    def completion_tokens(self, *kinds: str) -> int:
        return self._sum("completion_tokens", kinds or None)

    def cache_hit_rate(self, *kinds: str) -> float:
        """cached / prompt tokens over the requests of `kinds` (0.0 when there are none)."""
        prompt = self.prompt_tokens(*kinds)
        return self.cached_tokens(*kinds) / prompt if prompt else 0.0

    def __repr__(self) -> str:
        return (
            f"ProgramStats(requests={len(self.requests)}, prompt_tokens={self.prompt_tokens()}, "
            f"cached_tokens={self.cached_tokens()}, hit_rate={self.cache_hit_rate():.3f})"
        )
