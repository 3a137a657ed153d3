"""Validation of public requests: every rule gives INVALID_ARGUMENT with a message a person can
act on, before anything reaches the scheduler."""

from __future__ import annotations

import math
import random

from radixmesh_wire.pb import api_pb2
from radixmesh_wire.step_ops import DEFAULTS


class InvalidRequest(ValueError):
    """`field`: the request field at fault in the gRPC API's names ("" when none is): the HTTP
    APIs report it as `param`, in their own names."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


def check(cond: bool, message: str, field: str = "") -> None:
    if not cond:
        raise InvalidRequest(message, field)


def normalize_sampling(
    s: api_pb2.SamplingParams,
    lp: api_pb2.LogprobOptions,
    prompt_len: int,
    context_length: int,
    vocab_size: int,
    default_max_new: int,
    max_top_logprobs: int,
) -> api_pb2.SamplingParams:
    """Validate and fill defaults; returns a copy the scheduler can trust."""
    out = api_pb2.SamplingParams()
    out.CopyFrom(s)
    for fd, value in s.ListFields():  # every float knob, present and future
        if fd.type in (fd.TYPE_FLOAT, fd.TYPE_DOUBLE) and not fd.is_repeated:
            check(math.isfinite(value), f"{fd.name} must be a finite number, got {value}", fd.name)
    check(prompt_len > 0, "the prompt is empty: send non-empty text, chat messages or input_ids")
    check(
        prompt_len < context_length,
        f"the prompt has {prompt_len} tokens but the context window is {context_length}: "
        "shorten it",
    )
    room = context_length - prompt_len
    if s.HasField("max_new_tokens"):
        check(
            s.max_new_tokens >= 0,
            f"max_new_tokens must be >= 0, got {s.max_new_tokens}",
            "max_new_tokens",
        )
        check(
            s.max_new_tokens <= room,
            f"max_new_tokens={s.max_new_tokens} goes beyond the context window: the prompt has "
            f"{prompt_len} tokens and the window {context_length}, so at most {room}",
            "max_new_tokens",
        )
    else:
        out.max_new_tokens = min(default_max_new, room)
    if s.HasField("temperature"):
        check(s.temperature >= 0, f"temperature must be >= 0, got {s.temperature}", "temperature")
    else:
        out.temperature = DEFAULTS.temperature
    if s.HasField("top_p"):
        check(0 < s.top_p <= 1, f"top_p must be in (0, 1], got {s.top_p}", "top_p")
    if s.HasField("top_k"):
        check(s.top_k >= -1, f"top_k must be -1 (off), 0 (off) or positive, got {s.top_k}", "top_k")
    if s.HasField("min_p"):
        check(0 <= s.min_p <= 1, f"min_p must be in [0, 1], got {s.min_p}", "min_p")
    if s.HasField("min_new_tokens"):
        check(
            s.min_new_tokens >= 0,
            f"min_new_tokens must be >= 0, got {s.min_new_tokens}",
            "min_new_tokens",
        )
        check(
            s.min_new_tokens <= out.max_new_tokens,
            f"min_new_tokens={s.min_new_tokens} exceeds max_new_tokens={out.max_new_tokens}",
            "min_new_tokens",
        )
    for t in s.stop_token_ids:
        check(
            0 <= t < vocab_size,
            f"stop token id {t} is outside the vocabulary [0, {vocab_size})",
            "stop_token_ids",
        )
    _check_penalties(s, vocab_size)
    if not s.HasField("seed"):
        # A fixed seed per request keeps sampling reproducible across retraction/resubmission.
        out.seed = random.getrandbits(63)
    check(lp.top_logprobs >= 0, "top_logprobs must be >= 0", "top_logprobs")
    check(
        lp.top_logprobs <= max_top_logprobs,
        f"top_logprobs={lp.top_logprobs} exceeds the limit {max_top_logprobs}",
        "top_logprobs",
    )
    if lp.HasField("prompt_logprobs_from"):
        p = lp.prompt_logprobs_from
        check(
            0 <= p < prompt_len,
            f"prompt_logprobs_from={p} must be within the prompt [0, {prompt_len})",
        )
    return out


def _check_penalties(s: api_pb2.SamplingParams, vocab_size: int) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        v = getattr(s, name)
        check(-2 <= v <= 2, f"{name} must be in [-2, 2], got {v}", name)
    if s.HasField("repetition_penalty"):
        r = s.repetition_penalty
        check(0 < r <= 2, f"repetition_penalty must be in (0, 2], got {r}", "repetition_penalty")
    check(
        len(s.logit_bias) <= 300,
        f"logit_bias has {len(s.logit_bias)} entries; at most 300",
        "logit_bias",
    )
    for t, b in s.logit_bias.items():
        check(
            0 <= t < vocab_size,
            f"logit_bias token id {t} is outside [0, {vocab_size})",
            "logit_bias",
        )
        check(-100 <= b <= 100, f"logit_bias[{t}]={b} must be in [-100, 100]", "logit_bias")


def check_text_size(chars: int, limit: int, what: str = "the prompt") -> None:
    """`limit`: the most characters the front door tokenizes for one request."""
    check(
        chars <= limit,
        f"{what} has {chars} characters; this server tokenizes at most {limit} per request "
        "(--max-input-chars, or what the context window can hold): shorten it",
    )


def check_input_ids(ids: list[int], vocab_size: int) -> None:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    check(
        not bad,
        f"input_ids contain {len(bad)} ids outside the vocabulary [0, {vocab_size}), "
        f"e.g. {bad[:3]}",
    )


# The roles every supported chat template renders (the DSL's rm.system/user/assistant too).
# Templates differ in what they do with others (SmolLM2's renders any name as a turn), so the
# front door refuses them rather than let a typo ("bot") become a prompt.
CHAT_ROLES = ("system", "user", "assistant", "tool")  # OpenAI's `developer` is `system`


def check_chat_roles(roles: list[str]) -> None:
    for i, role in enumerate(roles):
        check(
            role in CHAT_ROLES,
            f"chat message {i} has role {role!r}; valid roles are {', '.join(CHAT_ROLES)}",
            f"messages[{i}].role",
        )


def check_resume(ids: list[int], vocab_size: int, max_new_tokens: int) -> None:
    """`resume_output_ids` of a continuation: in the vocabulary, within the token budget."""
    bad = [i for i in ids if not 0 <= i < vocab_size]
    check(not bad, f"resume_output_ids contain ids outside the vocabulary, e.g. {bad[:3]}")
    check(
        len(ids) <= max_new_tokens,
        f"resume_output_ids has {len(ids)} tokens but max_new_tokens is {max_new_tokens}: "
        "send the original request's max_new_tokens (it counts the resumed tokens)",
    )
