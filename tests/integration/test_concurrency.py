"""16 concurrent streams of different lengths each agree with their solo run; a seeded sampled
request gives identical text alone and inside a batch."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from radixmesh.api import Client, GenerateResult

from tests.conftest import Stack

pytestmark = pytest.mark.integration

TOPICS = [
    "the ocean",
    "a robot",
    "mountains",
    "coffee",
    "winter",
    "a library",
    "jazz",
    "volcanoes",
    "bicycles",
    "the moon",
    "bread",
    "rivers",
    "chess",
    "owls",
    "trains",
    "gardens",
]


def _requests() -> list[dict]:
    out = []
    for i, topic in enumerate(TOPICS):
        prompt = f"Write a short note about {topic}." + " Please be specific." * (i % 4)
        out.append(
            {
                "messages": [{"role": "user", "content": prompt}],
                "max_new_tokens": 4 + (i * 7) % 29,
                "temperature": 0,
                "return_logprob": True,
            }
        )
    return out


def _same(a: GenerateResult, b: GenerateResult) -> None:
    """The numerics rule (docs/architecture.md) between two runs of our own stack: identical up
    to a first difference that is only allowed where the two runs' chosen-token logprobs
    already diverge."""
    for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids, strict=False)):
        if x != y:
            worst = max(
                (
                    abs(p.logprob - q.logprob)
                    for p, q in zip(a.output_logprobs[:i], b.output_logprobs[:i], strict=True)
                ),
                default=0.0,
            )
            pytest.fail(f"diverged at {i} ({x} vs {y}); earlier logprob diff {worst:.2e}")
    assert len(a.output_ids) == len(b.output_ids)
    assert a.finish_reason == b.finish_reason


def test_sixteen_concurrent_streams_match_solo(stack: Stack) -> None:
    reqs = _requests()
    with Client(stack.endpoint) as c:
        solo = [c.generate(**r) for r in reqs]

        def streamed(r: dict) -> GenerateResult:
            text, final = "", None
            for item in c.stream(**r):
                if isinstance(item, GenerateResult):
                    final = item
                else:
                    text += item.text
            assert final is not None and text == final.text
            return final

        with ThreadPoolExecutor(16) as pool:
            together = list(pool.map(streamed, reqs))
    for a, b in zip(solo, together, strict=True):
        _same(a, b)
    assert len({r.completion_tokens for r in together}) > 4  # really different lengths


def test_seeded_sample_same_alone_and_batched(stack: Stack) -> None:
    kw: dict[str, Any] = {
        "prompt": "My favourite animal is",
        "max_new_tokens": 16,
        "temperature": 0.9,
        "top_p": 0.95,
        "seed": 1234,
        "ignore_eos": True,
    }
    with Client(stack.endpoint) as c:
        alone = c.generate(**kw)
        others = [dict(kw, seed=s, prompt=f"Story {s}:") for s in range(6)]
        with ThreadPoolExecutor(7) as pool:
            futs = [pool.submit(c.generate, **o) for o in others]
            batched = pool.submit(c.generate, **kw).result()
            [f.result() for f in futs]
        different = c.generate(**dict(kw, seed=99))
    assert alone.output_ids == batched.output_ids
    assert alone.text == batched.text
    assert different.output_ids != alone.output_ids
