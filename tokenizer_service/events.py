"""What the front door's core streams out: plain dataclasses, no transport types."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Chunk:
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob]


@dataclass
class Complete:
    text: str
    output_ids: list[int]
    finish_reason: str  # "stop", "length", "abort"
    matched_stop: str
    prompt_ids: list[int]
    cached_tokens: int
    output_logprobs: list[TokenLogprob]
    prompt_logprobs: list[TokenLogprob]
    prompt_logprobs_from: int

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)


Event = Chunk | Complete
