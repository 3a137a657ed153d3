"""Token-exact agreement with HF transformers through all four services over gRPC, with and
without NaN-poisoned freed KV slots (docs/architecture.md, Checking numerics)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from radixmesh.api import Client

from tests.conftest import Stack
from tests.integration.hf_reference import HFReference, agree

pytestmark = pytest.mark.integration

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "List three primary colors:\n1.",
    "Photosynthesis is the process by which",
]
N = 32


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> HFReference:
    return HFReference(model_dir)


@pytest.fixture(scope="module")
def references(hf: HFReference, stack: Stack) -> dict[str, object]:
    with Client(stack.endpoint) as c:
        ids = {p: c.tokenize(p, add_special_tokens=True) for p in PROMPTS}
    return {p: (ids[p], hf.greedy(ids[p], N)) for p in PROMPTS}


@pytest.fixture(params=["stack", "nan_stack"])
def any_stack(request: pytest.FixtureRequest) -> Stack:
    return request.getfixturevalue(request.param)


def test_greedy_agrees_with_hf(any_stack: Stack, references: dict) -> None:
    with Client(any_stack.endpoint) as c, ThreadPoolExecutor(len(PROMPTS)) as pool:
        futs = {
            p: pool.submit(
                c.generate,
                input_ids=references[p][0],
                max_new_tokens=N,
                temperature=0,
                ignore_eos=True,
                return_logprob=True,
            )
            for p in PROMPTS
        }
        for p, fut in futs.items():
            res = fut.result()
            ref = references[p][1]
            ok, why = agree(res.output_ids, ref, [lp.logprob for lp in res.output_logprobs])
            assert ok, f"{p!r}: {why}"
            assert res.completion_tokens == N and res.finish_reason == "length"


def test_prompt_logprobs_match_hf(any_stack: Stack, hf: HFReference, references: dict) -> None:
    with Client(any_stack.endpoint) as c:
        for p in PROMPTS[:3]:
            ids = references[p][0]
            res = c.generate(input_ids=ids, max_new_tokens=0, prompt_logprobs_from=1)
            ref = hf.prompt_logprobs(ids)
            assert [lp.token_id for lp in res.prompt_logprobs] == ids[1:]
            got = [lp.logprob for lp in res.prompt_logprobs]
            assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < 1e-3


def test_chat_capital_of_france(stack: Stack) -> None:
    with Client(stack.endpoint) as c:
        res = c.generate(
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_new_tokens=24,
            temperature=0,
        )
    assert "Paris" in res.text
    assert res.finish_reason in ("stop", "length")
