"""The scheduler's own submission checks: each refusal names the rule, each valid request
passes (the front door is not the only client of the Session stream)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from scheduler_service.request import Request, SamplingSpec
from scheduler_service.status import Status
from scheduler_service.submit_validation import SubmitError, SubmitLimits, validate_submit

LIM = SubmitLimits(vocab_size=1000, context_length=100, kv_capacity=500, max_top_logprobs=20)


def _req(prompt: list[int] | None = None, output: list[int] | None = None, **kw: Any) -> Request:
    eos = kw.pop("eos", frozenset({2}))
    rid = kw.pop("rid", "r1")
    key = kw.pop("key", 7)
    spec = SamplingSpec(**{"max_new_tokens": 8, **kw})
    return Request(
        rid=rid,
        session="s",
        prompt=[1, 2, 3] if prompt is None else prompt,
        spec=spec,
        eos_ids=eos,
        output=output or [],
        key=key,
    )


def test_valid_requests_pass() -> None:
    validate_submit(_req(), LIM)
    validate_submit(_req(prompt=[0] * 99, max_new_tokens=1), LIM)  # fills the window exactly
    validate_submit(_req(prompt=[0] * 100, max_new_tokens=0), LIM)  # prefill only
    validate_submit(_req(stop_token_ids=(999,), min_new_tokens=8, top_logprobs=20), LIM)


BAD = [
    (_req(prompt=[]), "input_ids is empty"),
    (_req(prompt=[1, 1_000_000]), "outside the vocabulary"),
    (_req(prompt=[-1]), "outside the vocabulary"),
    (_req(output=[5000]), "output_ids contain"),
    (_req(eos=frozenset({1000})), "eos_token_ids contain"),
    (_req(stop_token_ids=(1_000_000,), min_new_tokens=2), "stop_token_ids contain"),
    (_req(rid=""), "request id is empty"),
    (_req(key=0), "session key"),
    (_req(temperature=math.inf), "temperature"),
    (_req(temperature=math.nan), "temperature"),
    (_req(temperature=-1.0), "temperature"),
    (_req(top_p=0.0), "top_p"),
    (_req(top_p=math.nan), "top_p"),
    (_req(top_k=-2), "top_k"),
    (_req(min_p=1.5), "min_p"),
    (_req(max_new_tokens=-1), "max_new_tokens"),
    (_req(min_new_tokens=9), "min_new_tokens"),
    (_req(top_logprobs=21), "top_logprobs"),
    (_req(prompt_logprobs_from=3), "prompt_logprobs_from"),
    (_req(presence_penalty=math.inf), "presence_penalty"),
    (_req(repetition_penalty=0.0), "repetition_penalty"),
    (_req(logit_bias=((1000, 1.0),)), "logit_bias"),
    (_req(output=[1] * 9), "exceed max_new_tokens"),
    (_req(prompt=[0] * 101, max_new_tokens=0), "context window is 100"),
    (_req(prompt=[0] * 100, max_new_tokens=1), "context window is 100"),
]


@pytest.mark.parametrize(("req", "needle"), BAD, ids=[n for _, n in BAD])
def test_bad_submissions_refused(req: Request, needle: str) -> None:
    with pytest.raises(SubmitError) as err:
        validate_submit(req, LIM)
    assert err.value.code == Status.INVALID_ARGUMENT
    assert needle in str(err.value)


def test_kv_capacity_bound() -> None:
    small = SubmitLimits(vocab_size=1000, context_length=100, kv_capacity=50, max_top_logprobs=0)
    with pytest.raises(SubmitError, match="exceeds the KV capacity of 50 tokens"):
        validate_submit(_req(prompt=[1] * 45, max_new_tokens=6), small)
    validate_submit(_req(prompt=[1] * 45, max_new_tokens=5), small)
