"""Every bad sampling setting is refused with a message naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from radixmesh_wire.pb import api_pb2
from tokenizer_service.validation import InvalidRequest, normalize_sampling


def _norm(
    prompt_len: int = 10, lp: api_pb2.LogprobOptions | None = None, **kw: Any
) -> api_pb2.SamplingParams:
    return normalize_sampling(
        api_pb2.SamplingParams(**kw), lp or api_pb2.LogprobOptions(), prompt_len, 100, 1000, 128, 20
    )


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"max_new_tokens": 91}, "context window"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": 0.0}, "top_p"),
        ({"temperature": -0.1}, "temperature"),
        ({"min_new_tokens": 5, "max_new_tokens": 4}, "min_new_tokens"),
        ({"min_p": 2.0}, "min_p"),
        ({"stop_token_ids": [5000]}, "stop token"),
    ],
)
def test_rejects(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest, match=field):
        _norm(**kw)


def test_empty_and_too_long_prompt() -> None:
    with pytest.raises(InvalidRequest, match="empty"):
        _norm(prompt_len=0)
    with pytest.raises(InvalidRequest, match="context window"):
        _norm(prompt_len=100)


def test_defaults_and_zero_max_new_tokens() -> None:
    s = _norm(prompt_len=50)
    assert s.max_new_tokens == 50  # default 128 clamped to the room left
    assert s.temperature == 1.0 and s.HasField("seed")
    assert _norm(max_new_tokens=0).max_new_tokens == 0


def test_prompt_logprobs_range() -> None:
    with pytest.raises(InvalidRequest, match="prompt_logprobs_from"):
        _norm(lp=api_pb2.LogprobOptions(prompt_logprobs_from=10))
