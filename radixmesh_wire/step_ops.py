"""Typed step operations: the step protocol (model.proto) as both ends see it.

The scheduler plans a `StepOps` (and `LateMasks`) and reads a `StepOutcome`; the model service
executes a `StepOps` and reports a `StepOutput`. `step_codec` converts each to and from its
protobuf message at the process boundary, so neither side's core touches protobuf.

Id and slot lists are plain lists here; the codec packs them into int32 `bytes` (the wire
form of lists on internal streams). Ops are built once and not changed after `encode_step`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixmesh_wire.image_geometry import ImageGeometry
from radixmesh_wire.images import ImageInput
from radixmesh_wire.mask_rows import EncodedRow


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What the scheduler learns of the model service when a step session opens."""

    model_name: str
    kv_capacity: int  # token slots: slot ids are 0 .. kv_capacity - 1
    context_length: int
    vocab_size: int
    nan_fill: bool  # debug: freed slots are poisoned, so the scheduler reports them
    eos_token_ids: tuple[int, ...] = ()  # a constrained request ends at these (its grammar's end)
    device: str = ""  # "cuda..." or else CPU: the default prefill chunk sizes (chunk_budget)
    host_kv_capacity: int = 0  # host-memory KV slots (issue 31): 0 = no host tier
    image_tokens: int = 0  # tokens per image (multimodal models); 0: text-only, no images
    # Its image layout: an image's count and pixel shape by its size (None: check the count)
    image_geometry: ImageGeometry | None = None


@dataclass(frozen=True)
class Sampling:
    """The one sampling type: what a request asks of sampling and of its length, as the
    scheduler keeps it (`Request.spec`) and the model service runs it (`AdmitOp.sampling`).
    Its field defaults are the one table of defaults (`DEFAULTS`): the front door's validation
    fills an unset field from it, and `radixmesh_wire.sampling` reads the public wire
    message (`api_pb2.SamplingParams` + `LogprobOptions`) into it field by field, by name.
    The model service ignores the length fields (max_new_tokens, ignore_eos, stop_token_ids:
    the scheduler's); the scheduler fills `stop_ids` and `penalty_history` per admission."""

    temperature: float = 1.0
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
    max_new_tokens: int = 128  # the front door's --default-max-new-tokens starts from this
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()  # end the request (besides the model's EOS)

    @property
    def penalized(self) -> bool:
        """Whether the sampler must count this request's output tokens."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
        )


DEFAULTS = Sampling()  # the table of defaults: every layer reads an unset field's value here


@dataclass(frozen=True)
class AdmitOp:
    handle: int
    sampling: Sampling
    output_offset: int
    prefix_slots: list[int]
    input_ids: list[int]
    slots: list[int]
    sample: bool
    rid: str = ""  # the request's id: the model service's log lines about it name it
    images: tuple[ImageInput, ...] = ()  # its images with their pixels (multimodal models)


@dataclass(frozen=True)
class ExtendOp:
    handle: int
    input_ids: list[int]
    slots: list[int]
    sample: bool


@dataclass(frozen=True)
class KVCopy:
    """Copy the KV of slots ``src`` of every layer's K and V into slots ``dst`` of the other
    pool: GPU -> host (``to_host``, a save) or host -> GPU (a load). The same op on every
    tensor-parallel rank: each copies its own KV heads. A step's copies run in list order,
    after its releases and before its forward pass; a load runs beside that forward pass, so
    no row of its step may touch the slots it writes: the next step reads them (docs/radix.md,
    "Host tier")."""

    to_host: bool
    src: list[int]
    dst: list[int]


@dataclass
class StepOps:
    step_id: int
    admits: list[AdmitOp] = field(default_factory=list)
    extends: list[ExtendOp] = field(default_factory=list)
    decode_handles: list[int] = field(default_factory=list)
    decode_slots: list[int] = field(default_factory=list)
    truncates: list[tuple[int, int]] = field(default_factory=list)  # (handle, keep length)
    releases: list[int] = field(default_factory=list)
    freed_slots: list[int] = field(default_factory=list)
    masks: dict[int, EncodedRow] = field(default_factory=dict)  # grammar masks by handle
    masks_follow: bool = False  # the constrained decode rows' masks come in a later LateMasks
    copies: list[KVCopy] = field(default_factory=list)  # host-tier saves and loads, in order


@dataclass
class LateMasks:
    """The masks of a `masks_follow` step's constrained decode rows (model.proto StepMasks)."""

    step_id: int
    rows: dict[int, EncodedRow] = field(default_factory=dict)
    skip: list[int] = field(default_factory=list)  # decode rows not to sample after all


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
    """A step's result as the model service produces it (one object per sampled row)."""

    step_id: int
    rows: list[RowOutput]
    prompt_logprobs: list[PromptLogprobs]
    forward_ms: float


@dataclass
class StepOutcome:
    """A step's result as the scheduler reads it: columns, no object per row (it runs for
    every running request every step). `handles[i]` sampled `tokens[i]` with `logprobs[i]`."""

    step_id: int
    handles: list[int]
    tokens: list[int]
    logprobs: list[float]
    top: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict)  # top ids, lps
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)
    forward_ms: float = 0.0
    error: str = ""  # non-empty: the step failed (the worker stays up)
