"""The scheduler's packed per-step output, end to end: streamed chunks, per-token top
logprobs, a stop string that ends a request mid-stream, and a stop token id all reach the
client exactly as a plain non-streamed run of the same request says."""

from __future__ import annotations

from typing import Any

import pytest
from radixmesh.api import Chunk, Client, GenerateResult

from tests.conftest import Stack

pytestmark = pytest.mark.integration

ARGS: dict[str, Any] = {
    "prompt": "Here is a list of animals: cat, dog, horse,",
    "max_new_tokens": 24,
    "temperature": 0,
    "ignore_eos": True,
}


def test_stream_equals_plain_run_with_top_logprobs(stack: Stack) -> None:
    with Client(stack.endpoint) as c:
        plain = c.generate(**ARGS, top_logprobs=3)
        parts = list(c.stream(**ARGS, top_logprobs=3))
    assert plain.finish_reason == "length" and len(plain.output_ids) == 24
    assert [lp.token_id for lp in plain.output_logprobs] == plain.output_ids
    for lp in plain.output_logprobs:
        assert len(lp.top) == 3
        assert lp.top[0][0] == lp.token_id  # greedy: the chosen token is the most likely
        assert lp.top[0][1] == pytest.approx(lp.logprob, abs=1e-4)
    chunks = [p for p in parts if isinstance(p, Chunk)]
    final = parts[-1]
    assert isinstance(final, GenerateResult) and len(chunks) == len(parts) - 1
    assert [t for ch in chunks for t in ch.token_ids] == plain.output_ids
    assert "".join(ch.text for ch in chunks) == plain.text == final.text
    assert final.output_ids == plain.output_ids


def test_stop_string_and_stop_token_end_the_request(stack: Stack) -> None:
    with Client(stack.endpoint) as c:
        plain = c.generate(**ARGS)
        # A stop string from the middle of the known output: the text ends right before it.
        words = plain.text.split()
        assert len(words) >= 4, plain.text
        stop = " " + words[len(words) // 2]
        cut = plain.text.index(stop)
        by_string = c.generate(**ARGS, stop=[stop])
        streamed = list(c.stream(**ARGS, stop=[stop]))
        # A stop token id: the output ends before its first occurrence, which it excludes.
        tok = plain.output_ids[5]
        by_token = c.generate(**ARGS, stop_token_ids=[tok])
    assert (by_string.text, by_string.finish_reason) == (plain.text[:cut], "stop")
    assert by_string.matched_stop == stop
    final = streamed[-1]
    assert isinstance(final, GenerateResult) and final.text == plain.text[:cut]
    assert "".join(p.text for p in streamed if isinstance(p, Chunk)) == plain.text[:cut]
    first = plain.output_ids.index(tok)
    assert by_token.output_ids == plain.output_ids[:first]
    assert (by_token.finish_reason, by_token.matched_stop) == ("stop", str(tok))
