"""Issue 33's behaviours on the live CPU stack, each checked against something independent of
the code under test: the server's own counters, prompt logprobs fetched separately, the
regexes' full matches, pydantic's validation, and the interpreter's output of the same program.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pydantic
import pytest
import radixmesh as rm
from radixmesh.api import Client
from radixmesh.lang.backend import LogprobRequest
from radixmesh.lang.ir import REGEX_FLOAT
from radixmesh.lang.params import GenParams
from radixmesh.srt.constrained.outlines_backend import build_regex_from_object

from tests.conftest import Stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def backend(stack: Stack) -> Iterator[rm.GrpcBackend]:
    b = rm.RuntimeEndpoint(stack.endpoint, timeout=120)
    previous = rm.global_config.default_backend
    rm.set_default_backend(b)  # a program called from a program runs on the default backend
    yield b
    rm.set_default_backend(previous)
    b.close()


@rm.function
def number(s, i):  # type: ignore[no-untyped-def]
    s += "Pick a number between 0 and 10, with decimals: "
    s += rm.gen("x", dtype=float, temperature=1.0, seed=i, max_tokens=10)


#: A float's prefix (what a gen cut by max_tokens may end with).
_FLOAT_PREFIX = r"[-+]?[0-9]*\.?[0-9]*[ \n]*"


def test_gen_dtype_float_at_temperature_one_stays_in_the_grammar(
    backend: rm.GrpcBackend,
) -> None:
    """Once failed with INTERNAL "token rejected by the grammar" (the sampler escaping its
    masks, fixed in cd052b6): 24 seeded samples must all succeed and match REGEX_FLOAT."""
    states = number.run_batch([{"i": i} for i in range(24)], backend=backend)
    for state in states:
        assert state.error() is None, state.error()
        value, meta = state["x"], state.get_meta_info("x")
        assert meta is not None
        if meta["finish_reason"]["type"] == "length":
            assert re.fullmatch(_FLOAT_PREFIX, value), value
        else:
            assert re.fullmatch(REGEX_FLOAT, value), value
    assert sum(re.fullmatch(REGEX_FLOAT, s["x"]) is not None for s in states) >= 12


@rm.function
def next_token(s):  # type: ignore[no-untyped-def]
    s += "The capital of France is"
    s += rm.gen(
        "top", max_tokens=0, return_logprob=True, top_logprobs_num=3, return_text_in_logprobs=True
    )


def test_max_tokens_zero_top_logprobs_equal_the_prompt_logprobs_of_the_next_position(
    backend: rm.GrpcBackend,
) -> None:
    state = next_token.run(temperature=0.8)
    assert state["top"] == "" and state.text() == "The capital of France is"
    meta = state.get_meta_info("top")
    assert meta is not None
    top = meta["output_top_logprobs"][0]
    assert len(top) == 3 and [lp for lp, _, _ in top] == sorted(
        (lp for lp, _, _ in top), reverse=True
    )
    assert all(text == backend.detokenize([tid]) for _, tid, text in top)
    # Independently: each alternative scored as a prompt token after the prompt (the prompt
    # logprob path) has the logprob reported, and a greedy token is the best alternative.
    ids = backend.tokenize("The capital of France is")
    for lp, tid, _ in top:
        scored = backend.generate(
            [*ids, tid],
            GenParams(max_new_tokens=0),
            logprobs=LogprobRequest(prompt_logprobs_from=len(ids)),
        )
        assert scored.prompt_logprobs[0].token_id == tid
        assert scored.prompt_logprobs[0].logprob == pytest.approx(lp, abs=2e-3)
    greedy = backend.generate(ids, GenParams(max_new_tokens=1, temperature=0, ignore_eos=True))
    assert greedy.output_ids[0] == top[0][1]


def test_the_runtime_reports_no_top_logprobs_for_a_prefill_only_request(
    backend: rm.GrpcBackend,
) -> None:
    """Why the DSL probes with one token: over gRPC, max_new_tokens=0 with top logprobs
    returns no output position at all (a prefill-only request computes no next-token logits),
    and prompt logprobs carry no alternatives. If this starts failing, the runtime can serve
    `gen(max_tokens=0, top_logprobs_num=k)` directly and the probe can go."""
    with Client(backend.endpoint, timeout=60) as client:
        result = client.generate(
            "The capital of France is",
            max_new_tokens=0,
            return_logprob=True,
            top_logprobs=3,
            prompt_logprobs_from=1,
        )
    assert result.output_logprobs == [] and result.completion_tokens == 0
    assert result.prompt_logprobs and all(t.top == [] for t in result.prompt_logprobs)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    country: str = pydantic.Field(max_length=12)
    population_millions: int


@rm.function
def city_json(s):  # type: ignore[no-untyped-def]
    s += "Describe Paris as JSON.\n"
    s += rm.gen("json", max_tokens=64, temperature=0, regex=build_regex_from_object(City))


def test_build_regex_from_object_constrains_to_a_valid_instance(backend: rm.GrpcBackend) -> None:
    state = city_json.run()
    assert state.error() is None, state.error()
    City.model_validate_json(state["json"])


@rm.function
def expand(s, tip):  # type: ignore[no-untyped-def]
    s += "Expand this tip into one sentence: " + tip + "\nSentence:"
    # temperature on the gen itself: run as a program of its own (interpreter mode), the call
    # does not inherit the caller's run(temperature=0), as in SGLang
    s += rm.gen("detailed_tip", max_tokens=6, stop="\n", temperature=0)


@rm.function
def tip_suggestion(s, topic):  # type: ignore[no-untyped-def]
    s += "Here are 2 tips for " + topic + ".\n"
    s += "1." + rm.gen("tip_1", stop=["\n", ":", "."], max_tokens=6) + "\n"
    s += "2." + rm.gen("tip_2", stop=["\n", ":", "."], max_tokens=6) + "\n"
    branch1 = expand(tip=s["tip_1"])
    branch2 = expand(tip=s["tip_2"])
    s += "Tip 1:" + branch1["detailed_tip"] + "\n"
    s += "Tip 2:" + branch2["detailed_tip"] + "\n"


def test_a_program_calling_a_program_compiles_and_runs_like_the_interpreter(
    backend: rm.GrpcBackend,
) -> None:
    compiled = tip_suggestion.compile()
    assert compiled.num_streams == 3
    from_graph = compiled.run(topic="staying healthy", temperature=0).wait()
    interpreted = tip_suggestion.run(topic="staying healthy", temperature=0)
    assert from_graph.error() is None and interpreted.error() is None
    assert from_graph.text() == interpreted.text()
    assert from_graph.text().count("Tip ") == 2 and len(from_graph.text()) > 80


@rm.function(num_api_spec_tokens=32)
def character(s):  # type: ignore[no-untyped-def]
    s += "Construct a character.\nName: Steve Jobs\nBirthday: February 24, 1955\n\n"
    s += "Name:" + rm.gen("name", stop="\n") + "\nBirthday:" + rm.gen("birthday", stop="\n")


def test_token_usage_after_speculation_matches_the_servers_counters(stack: Stack) -> None:
    own = rm.RuntimeEndpoint(stack.endpoint, timeout=120)
    with Client(stack.endpoint, timeout=60) as client:
        before = client.stats()
        state = character.run(backend=own, temperature=0).wait()
        after = client.stats()
    assert state.error() is None
    usage = own.token_usage
    assert usage.prompt_tokens == after.prompt_tokens - before.prompt_tokens > 0
    generated = after.generated_tokens - before.generated_tokens
    assert 0 < usage.completion_tokens <= generated <= usage.completion_tokens + 1  # + an EOS
    own.close()
