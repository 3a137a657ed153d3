"""Typed step operations (decoded from the model.proto Step at the server boundary)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int = 0
    return_logprob: bool = False
    top_logprobs: int = 0
    prompt_logprobs_from: int = -1  # absolute prompt position; -1 = none
    min_new_tokens: int = 0
    stop_ids: tuple[int, ...] = ()  # banned while fewer than min_new_tokens were sampled
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    penalty_history: tuple[int, ...] = ()  # output tokens sampled before this admission

    @property
    def penalized(self) -> bool:
        """Whether the sampler must count this request's output tokens."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
        )


@dataclass(frozen=True)
class AdmitOp:
    handle: int
    sampling: Sampling
    output_offset: int
    prefix_slots: list[int]
    input_ids: list[int]
    slots: list[int]
    sample: bool


@dataclass(frozen=True)
class ExtendOp:
    handle: int
    input_ids: list[int]
    slots: list[int]
    sample: bool


@dataclass
class StepOps:
    step_id: int
    admits: list[AdmitOp] = field(default_factory=list)
    extends: list[ExtendOp] = field(default_factory=list)
    decode_handles: list[int] = field(default_factory=list)
    decode_slots: list[int] = field(default_factory=list)
    truncates: list[tuple[int, int]] = field(default_factory=list)
    releases: list[int] = field(default_factory=list)
    freed_slots: list[int] = field(default_factory=list)
    masks: dict[int, tuple[int, bytes]] = field(default_factory=dict)  # handle -> (encoding, data)
    masks_follow: bool = False  # the constrained decode rows' masks come in a later StepMasks


@dataclass
class RowOutput:
    handle: int
    token: int
    logprob: float
    top_ids: list[int] | None = None
    top_logprobs: list[float] | None = None


@dataclass
class PromptLogprobs:
    handle: int
    start: int  # absolute position of values[0]
    values: list[float]


@dataclass
class StepOutput:
    step_id: int
    rows: list[RowOutput]
    prompt_logprobs: list[PromptLogprobs]
    forward_ms: float
