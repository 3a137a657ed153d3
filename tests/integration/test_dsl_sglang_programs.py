"""SGLang's frontend test programs (test_programs.py, in their spirit), on the live CPU stack.

Each program is written as for SGLang (only the import differs) and checked on properties
that do not depend on the model's quality: stop strings honoured, variables spliced exactly
into the prompt, gathered joins in branch order, regex full matches, schema-valid JSON, token
limits, streamed text equal to non-streamed, and `select` equal to an independent argmax over
logprobs fetched separately. Generations are a few tokens long.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import radixmesh as rm
from radixmesh.lang.choices import sglang_normalized
from radixmesh.lang.scoring import boundary_entry, choice_tokens

from tests.conftest import Stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def backend(stack: Stack) -> Iterator[rm.GrpcBackend]:
    b = rm.RuntimeEndpoint(stack.endpoint, timeout=120)
    previous = rm.global_config.default_backend
    rm.set_default_backend(b)  # SGLang programs run on the default backend
    yield b
    rm.set_default_backend(previous)
    b.close()


@rm.function
def few_shot_qa(s, question):  # type: ignore[no-untyped-def]
    s += "The following are questions with answers.\n\n"
    s += "Q: What is the capital of France?\nA: Paris\n"
    s += "Q: What is the capital of Germany?\nA: Berlin\n"
    s += "Q: " + question + "\n"
    s += "A:" + rm.gen("answer", stop="\n", temperature=0, max_tokens=8)


def test_few_shot_qa_stop_and_splicing(backend: rm.GrpcBackend) -> None:
    state = few_shot_qa("What is the capital of Italy?")
    answer = state["answer"]
    assert "\n" not in answer
    prefix = (
        "The following are questions with answers.\n\n"
        "Q: What is the capital of France?\nA: Paris\n"
        "Q: What is the capital of Germany?\nA: Berlin\n"
        "Q: What is the capital of Italy?\nA:"
    )
    assert state.text() == prefix + answer
    meta = state.get_meta_info("answer")
    assert meta is not None and meta["completion_tokens"] <= 8


@rm.function
def multi_turn(s, question_1, question_2):  # type: ignore[no-untyped-def]
    s += rm.system("You are a helpful assistant.")
    s += rm.user(question_1)
    s += rm.assistant(rm.gen("answer_1", max_tokens=6))
    s += rm.user(question_2)
    s += rm.assistant(rm.gen("answer_2", max_tokens=6))


def test_multi_turn_chat_token_limits_and_messages(backend: rm.GrpcBackend) -> None:
    state = multi_turn.run(question_1="Name a fruit.", question_2="Name a colour.", temperature=0)
    for name in ("answer_1", "answer_2"):
        meta = state.get_meta_info(name)
        assert meta is not None and meta["completion_tokens"] <= 6
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == state["answer_1"].lstrip()
    assert messages[4]["content"] == state["answer_2"].lstrip()


@rm.function
def tip_suggestion(s):  # type: ignore[no-untyped-def]
    s += "Here are two tips for staying healthy: 1. Balanced Diet. 2. Regular Exercise.\n\n"
    forks = s.fork(2)
    for i in range(2):
        forks[i] += f"Now, expand tip {i + 1} into a paragraph:\n"
        forks[i] += rm.gen("detailed_tip", max_tokens=6, stop="\n\n")
    forks.join()
    s += "Tip 1:" + s["detailed_tip"][0] + "\nTip 2:" + s["detailed_tip"][1] + "\n"
    s += "In summary" + rm.gen("summary", max_tokens=4)
    s["forks"] = forks


def test_fork_gather_in_order_and_variables_spliced(backend: rm.GrpcBackend) -> None:
    state = tip_suggestion.run(temperature=0)
    forks = state["forks"]
    tips = state["detailed_tip"]
    assert tips == [forks[0]["detailed_tip"], forks[1]["detailed_tip"]]
    assert forks[1].text().endswith("expand tip 2 into a paragraph:\n" + tips[1])
    assert f"Tip 1:{tips[0]}\nTip 2:{tips[1]}\nIn summary{state['summary']}" in state.text()


@rm.function
def parallel_concat(s):  # type: ignore[no-untyped-def]
    s += "List:"
    forks = s.fork(3)
    forks += lambda i: f" item{i}"
    forks.join("concate_and_append")
    with s.var_scope("tail"):
        s += " end" + rm.gen("more", max_tokens=3)


def test_concate_and_append_and_var_scope(backend: rm.GrpcBackend) -> None:
    state = parallel_concat.run(temperature=0)
    assert state.text() == "List: item0 item1 item2 end" + state["more"]
    assert state["tail"] == " end" + state["more"]


NAME_AGE = r'\{"name": "[A-Z][a-z]{1,10}", "age": [0-9]{1,2}\}'


@rm.function
def regex_and_dtype(s):  # type: ignore[no-untyped-def]
    s += "Bob is 25. As JSON: " + rm.gen("json", max_tokens=24, regex=NAME_AGE)
    s += "\nHow many legs does a cat have? " + rm.gen_int("legs", max_tokens=4)


def test_regex_full_match_and_gen_int(backend: rm.GrpcBackend) -> None:
    state = regex_and_dtype.run(temperature=0)
    assert re.fullmatch(NAME_AGE, state["json"]), state["json"]
    assert re.fullmatch(rm.REGEX_INT, state["legs"]), state["legs"]


SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "rank": {"type": "integer"}},
    "required": ["city", "rank"],
    "additionalProperties": False,
}


@rm.function
def json_decode(s):  # type: ignore[no-untyped-def]
    s += rm.user("Give a city and its rank as JSON.")
    s += rm.assistant(rm.gen("info", max_tokens=32, json_schema=SCHEMA))


def test_json_schema_output_is_valid(backend: rm.GrpcBackend) -> None:
    out = json.loads(json_decode.run(temperature=0)["info"])
    assert set(out) == {"city", "rank"}
    assert isinstance(out["city"], str) and len(out["city"]) <= 12
    assert isinstance(out["rank"], int)


@rm.function
def streamed(s):  # type: ignore[no-untyped-def]
    s += rm.user("Say something about the sea.")
    s += rm.assistant(rm.gen("text", max_tokens=8))


def test_streamed_text_equals_non_streamed(backend: rm.GrpcBackend) -> None:
    state = streamed.run(temperature=0, stream=True)
    chunks = list(state.text_iter("text"))
    plain = streamed.run(temperature=0)
    assert "".join(chunks) == state["text"] == plain["text"]
    assert state.text() == plain.text()


CHOICES = [" Paris", " London", " Rome", " a city in Europe"]


@rm.function
def capital(s):  # type: ignore[no-untyped-def]
    s += "Q: What is the capital of France?\nA:" + rm.select("answer", CHOICES)


def test_select_equals_an_independent_argmax(backend: rm.GrpcBackend) -> None:
    state = capital.run()
    prompt = "Q: What is the capital of France?\nA:"
    prompt_ids = backend.tokenize(prompt)
    scores = []
    for choice in CHOICES:  # fetched independently of the select's own requests
        completion = backend.prompt_logprobs(prompt + choice, len(prompt_ids) - 1)
        tokens = choice_tokens(completion, prompt_ids)
        boundary = boundary_entry(completion, prompt_ids)
        values = ([boundary.logprob] if boundary else []) + [t.logprob for t in tokens]
        scores.append(sglang_normalized(values, boundary_is_prompt=boundary is not None))
    best = max(range(len(CHOICES)), key=lambda i: (scores[i], -i))
    assert state["answer"] == CHOICES[best]
    meta = state.get_meta_info("answer")
    assert meta is not None
    assert meta["normalized_prompt_logprobs"] == pytest.approx(scores, abs=1e-4)
    assert state.text() == prompt + CHOICES[best]


@rm.function
def character(s):  # type: ignore[no-untyped-def]
    s += "Construct a character.\nName: Steve Jobs\nBirthday: February 24, 1955\n\n"
    s += "Name:" + rm.gen("name", stop="\n", max_tokens=8)
    s += "\nBirthday:" + rm.gen("birthday", stop="\n", max_tokens=8)


def test_api_speculation_on_the_runtime(backend: rm.GrpcBackend) -> None:
    plain = character.run(temperature=0)
    spec = rm.function(num_api_spec_tokens=24)(character.func).run(temperature=0)
    meta = plain.get_meta_info("name")
    if meta is not None and meta["finish_reason"].get("matched") == "\n":
        assert spec["name"] == plain["name"]  # the same greedy text up to the first stop
    assert "\n" not in spec["name"] and "\n" not in spec["birthday"]
    assert len(spec.stats.requests) <= len(plain.stats.requests) == 2


@rm.function
def with_logprobs(s):  # type: ignore[no-untyped-def]
    s += "The sky is" + rm.gen(
        "g", max_tokens=3, return_logprob=True, top_logprobs_num=2, return_text_in_logprobs=True
    )


def test_gen_logprobs_in_meta_info(backend: rm.GrpcBackend) -> None:
    state = with_logprobs.run(temperature=0)
    meta = state.get_meta_info("g")
    assert meta is not None
    entries = meta["output_token_logprobs"]
    assert len(entries) == meta["completion_tokens"] <= 3
    assert all(isinstance(lp, float) and lp <= 0 and isinstance(t, int) for lp, t, _ in entries)
    assert "".join(text for _, _, text in entries) == state["g"]
    tops = meta["output_top_logprobs"]
    assert [len(t) for t in tops] == [2] * len(entries)
    # temperature 0: the sampled token is the best alternative
    assert all(top[0][1] == tid for top, (_, tid, _) in zip(tops, entries, strict=True))
