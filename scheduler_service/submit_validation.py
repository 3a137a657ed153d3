"""The scheduler's own checks of a submission, before it reaches the queue.

The front door validates public requests, but it is not the only client of the Session stream:
anything that reaches the step builder must be servable, because a bad row there fails (or,
before this module, killed) every request of the step. Every rule answers with a status and
a message a person can act on. Pure: no protobuf, no scheduler state beyond `SubmitLimits`.

Three layers, so nothing that can never be served waits in the queue:
- `validate_form`: what needs no model (ids, key, sampling ranges): checked at once, also
  while submissions are held for a model that has not connected yet;
- `check_unique`: a request id that is running, or a session key that a live request of the
  same session holds (its output would be mixed with the other's), is ALREADY_EXISTS;
- `validate_submit`: the form plus the connected model's vocabulary, context window and KV
  pool; run again on every waiting request when a model with other limits connects.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass

from radixmesh_wire.image_geometry import ImageGeometry, image_problem
from scheduler_service.request import Request
from scheduler_service.status import Status

_MAX_I32 = (1 << 31) - 1


class SubmitError(Exception):
    """A submission refused before it reached the queue (it alone fails)."""

    def __init__(self, code: Status, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SubmitLimits:
    """What the connected model can serve (from its WorkerInfo)."""

    vocab_size: int
    context_length: int
    kv_capacity: int
    max_top_logprobs: int
    image_tokens: int = 0  # tokens per image; 0: a text-only model (requests with images fail)
    # The model's image layout (None: every image takes image_tokens): any-resolution models
    # (LLaVA-NeXT) give an image of each size its own count and pixel shape.
    image_geometry: ImageGeometry | None = None


def _invalid(message: str) -> SubmitError:
    return SubmitError(Status.INVALID_ARGUMENT, message)


def _check_ids(what: str, ids: Iterable[int], vocab: int) -> None:
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise _invalid(
            f"{what} contain {len(bad)} ids outside the vocabulary [0, {vocab}), e.g. {bad[:3]}"
        )


def validate_form(req: Request, max_top_logprobs: int) -> None:
    """Raise SubmitError unless `req` is well formed, whatever model serves it."""
    if not req.rid:
        raise _invalid("the request id is empty")
    if not 0 < req.key <= _MAX_I32:
        raise _invalid(f"the session key must be in [1, {_MAX_I32}], got {req.key}")
    if not req.prompt:
        raise _invalid("input_ids is empty: a request needs at least one prompt token")
    _check_sampling(req, max_top_logprobs)
    if len(req.output) > req.spec.max_new_tokens:
        raise _invalid(
            f"output_ids ({len(req.output)} tokens) exceed max_new_tokens "
            f"({req.spec.max_new_tokens})"
        )


def check_unique(req: Request, running: Mapping[str, Request], live_keys: Container[int]) -> None:
    """ALREADY_EXISTS if `req.rid` is running (in any session) or `req.key` belongs to a live
    request of its own session (the outbox's keys: the key names a request's output)."""
    if req.rid in running:
        raise SubmitError(
            Status.ALREADY_EXISTS,
            f"request {req.rid!r} is running: abort it first or use another request id",
        )
    if req.key in live_keys:
        raise SubmitError(
            Status.ALREADY_EXISTS,
            f"session key {req.key} is in use by a live request of this session: give each "
            "live request its own key (a key may be reused once its request has ended)",
        )


def validate_submit(req: Request, lim: SubmitLimits) -> None:
    """Raise SubmitError unless `req` can be served by a model with these limits."""
    validate_form(req, lim.max_top_logprobs)
    vocab = lim.vocab_size
    _check_images(req, lim)
    _check_ids("input_ids", _text_ids(req), vocab)
    _check_ids("output_ids", req.output, vocab)
    _check_ids("eos_token_ids", req.eos_ids, vocab)
    _check_ids("stop_token_ids", req.spec.stop_token_ids, vocab)
    _check_vocab_sampling(req, lim)
    _check_lengths(req, lim)


def _text_ids(req: Request) -> list[int]:
    """The prompt less its images' positions (which hold pseudo ids, checked by
    `_check_images`)."""
    if not req.images:
        return req.prompt
    image = {p for im in req.images for p in range(im.offset, im.offset + im.n_tokens)}
    return [t for i, t in enumerate(req.prompt) if i not in image]


def _check_images(req: Request, lim: SubmitLimits) -> None:
    if not req.images:
        return
    if not lim.image_tokens:
        raise _invalid("the connected model is text-only: it cannot take images")
    if req.spec.prompt_logprobs_from >= 0:
        raise _invalid("prompt logprobs are not supported for requests with images")
    end = 0
    for im in req.images:
        bad = im.check()
        if not bad and lim.image_geometry is not None:
            bad = image_problem(im.n_tokens, im.image_size, im.shape, lim.image_geometry)
        elif not bad and im.n_tokens != lim.image_tokens:
            bad = f"{im.n_tokens} placeholder tokens; this model's images take {lim.image_tokens}"
        if not bad and (im.offset < end or im.offset + im.n_tokens > len(req.prompt)):
            bad = "images overlap, are out of order or run past the prompt"
        if not bad and not lim.vocab_size <= im.pseudo_id < (1 << 31) - 1:
            bad = f"image id {im.pseudo_id} is not above the vocabulary"
        if not bad and any(
            t != im.pseudo_id for t in req.prompt[im.offset : im.offset + im.n_tokens]
        ):
            bad = "the prompt does not hold the image's id at its positions"
        if bad:
            raise _invalid(f"image at position {im.offset}: {bad}")
        end = im.offset + im.n_tokens


def _check_vocab_sampling(req: Request, lim: SubmitLimits) -> None:
    s = req.spec
    if s.top_logprobs > lim.vocab_size:
        raise _invalid(f"top_logprobs={s.top_logprobs} exceeds the vocabulary ({lim.vocab_size})")
    for tok, _bias in s.logit_bias:
        if not 0 <= tok < lim.vocab_size:
            raise _invalid(
                f"logit_bias names token {tok}, outside the vocabulary [0, {lim.vocab_size})"
            )


def _check_sampling(req: Request, max_top_logprobs: int) -> None:
    s = req.spec
    if not (math.isfinite(s.temperature) and s.temperature >= 0):
        raise _invalid(f"temperature must be finite and >= 0, got {s.temperature}")
    if not (math.isfinite(s.top_p) and 0 < s.top_p <= 1):
        raise _invalid(f"top_p must be in (0, 1], got {s.top_p}")
    if s.top_k < -1:
        raise _invalid(f"top_k must be -1 (off), 0 (off) or positive, got {s.top_k}")
    if not (math.isfinite(s.min_p) and 0 <= s.min_p <= 1):
        raise _invalid(f"min_p must be in [0, 1], got {s.min_p}")
    if s.max_new_tokens < 0:
        raise _invalid(f"max_new_tokens must be >= 0, got {s.max_new_tokens}")
    if not 0 <= s.min_new_tokens <= s.max_new_tokens:
        raise _invalid(
            f"min_new_tokens={s.min_new_tokens} must be in [0, max_new_tokens={s.max_new_tokens}]"
        )
    if not 0 <= s.top_logprobs <= max_top_logprobs:
        raise _invalid(f"top_logprobs={s.top_logprobs} must be in [0, {max_top_logprobs}]")
    for name in ("presence_penalty", "frequency_penalty"):
        if not math.isfinite(getattr(s, name)):
            raise _invalid(f"{name} must be finite, got {getattr(s, name)}")
    if not (math.isfinite(s.repetition_penalty) and s.repetition_penalty > 0):
        raise _invalid(f"repetition_penalty must be finite and > 0, got {s.repetition_penalty}")
    for tok, bias in s.logit_bias:
        if tok < 0 or not math.isfinite(bias):
            raise _invalid(f"logit_bias entry ({tok}, {bias}): ids in [0, vocab), finite biases")
    p = s.prompt_logprobs_from
    if p != -1 and not 0 <= p < len(req.prompt):
        raise _invalid(
            f"prompt_logprobs_from={p} must be -1 (none) or within the prompt "
            f"[0, {len(req.prompt)})"
        )


def _check_lengths(req: Request, lim: SubmitLimits) -> None:
    fill = len(req.fill)
    ctx = lim.context_length
    # One position must stay free for the next token, unless nothing more is generated.
    if fill > ctx or (fill == ctx and req.remaining > 0):
        raise _invalid(
            f"the sequence has {fill} tokens but the context window is {ctx}: shorten the prompt"
        )
    need = fill + req.remaining
    if need > lim.kv_capacity:
        raise _invalid(
            f"prompt ({fill} tokens) + max_new_tokens ({req.remaining}) = {need} exceeds the KV "
            f"capacity of {lim.kv_capacity} tokens: shorten the prompt or lower max_new_tokens"
        )
