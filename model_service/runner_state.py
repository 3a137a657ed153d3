"""The runner's state types: a request's state under its handle, a row of a step, a launched
step, and the error a step inconsistent with that state raises.

Kept apart from `runner.py` so the step check (`step_validation.py`) and the tensor-parallel
ranks read the same types without the runner's execution code. Invariant per request:
len(slots) == tokens whose KV is (or, once queued work has run, will be) in the pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from model_service.image_rows import RequestImages
from model_service.penalty_rows import TokenCounts
from model_service.slot_seq import SlotSeq
from radixmesh_wire.mask_rows import EncodedRow
from radixmesh_wire.step_ops import PromptLogprobs, Sampling

# (masks by handle, handles not to sample: their decode is undone) for a masks_follow step
MaskSource = Callable[[int], tuple[dict[int, EncodedRow], set[int]]]


class StepError(Exception):
    """The step is inconsistent with the worker's state (a scheduler bug, never user input)."""


@dataclass
class RequestState:
    sampling: Sampling
    slots: SlotSeq
    # The seed position of its next draw: its output length then, jump-forward tokens
    # included (a stream resumed from the tokens received draws what the undisturbed one would).
    sampled: int
    has_token: bool = False  # its last sampled token is in ModelRunner.last_tokens
    in_prompt: bool = True
    pending_lp: torch.Tensor | None = None  # log-softmax of the last prompt position
    counts: TokenCounts = field(default_factory=TokenCounts)  # for penalties only
    prompt_len: int = -1  # known at its first sampled row: sequence length - output_offset
    images: RequestImages | None = None  # its images (multimodal models), from its ADMIT


@dataclass
class StepRow:
    """One row of a step: an admission's or extension's chunk, or a decode."""

    handle: int
    state: RequestState
    input_ids: list[int] | None  # None: a decode, whose input is the last sampled token
    new_slots: list[int]
    sample: bool

    @property
    def n(self) -> int:
        return len(self.new_slots)


@dataclass
class InFlight:
    """A launched step: device work queued, results on their way to host memory."""

    step_id: int
    t0: float
    handles: list[int] = field(default_factory=list)  # rows that sampled, in order
    top_n: list[int] = field(default_factory=list)
    tokens: torch.Tensor | None = None  # host copies, valid once `done` has completed
    logprobs: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_vals: torch.Tensor | None = None
    prompt_lps: list[PromptLogprobs] = field(default_factory=list)
    done: torch.cuda.Event | None = None
    gpu_start: torch.cuda.Event | None = None  # just before the forward pass
    # Late masks: the host's wait for them, and (CUDA) the GPU's, from the forward pass's end
    # to the first sampling kernel: > 0 only when the masks came after the forward finished.
    mask_wait_s: float = 0.0
    fwd_done: torch.cuda.Event | None = None
    sample_start: torch.cuda.Event | None = None
    # What the step ran (step_burst figures): input positions, and whether a CUDA graph ran it.
    tokens_in: int = 0
    graphed: bool = False
