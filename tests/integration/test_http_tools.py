"""Tool calling through the real `openai` SDK against the shared stack (SmolLM2-135M, greedy):
`required` and a named function generate their calls under the tools' JSON schemas through the
grammar service, so the arguments always validate; a streamed call arrives as `tool_calls`
deltas; `auto` reads a call the model writes after a worked example; a tool result is answered;
`developer` is `system`; what is not supported is a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.conftest import Stack

pytestmark = pytest.mark.integration

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=stack.http_url + "/v1", api_key="unused", max_retries=0)
    yield c
    c.close()


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _valid(name: str, arguments: str) -> dict[str, Any]:
    args = json.loads(arguments)
    jsonschema.validate(args, SCHEMAS[name])
    return args


def test_required_calls_validate_against_their_schemas(client: openai.OpenAI, model: str) -> None:
    for parallel in (True, False):
        out = client.chat.completions.create(
            model=model,
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=parallel,
            temperature=0,
            max_tokens=120,
        )
        choice = out.choices[0]
        calls = choice.message.tool_calls or []
        assert calls and choice.finish_reason == "tool_calls", choice
        assert len(calls) == 1 or parallel
        for c in calls:
            assert c.type == "function" and c.id.startswith("call_")
            _valid(c.function.name, c.function.arguments)  # type: ignore[union-attr]


def test_a_named_function_is_called_with_valid_arguments(client: openai.OpenAI, model: str) -> None:
    out = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Add 2 and 3."}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}},
        temperature=0,
        max_tokens=60,
    )
    (call,) = out.choices[0].message.tool_calls or []
    assert call.function.name == "add"  # type: ignore[union-attr]
    args = _valid("add", call.function.arguments)  # type: ignore[union-attr]
    assert set(args) == {"a", "b"}
    assert out.choices[0].message.content is None


def test_a_streamed_call_arrives_as_tool_call_deltas(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=60,
        stream=True,
    )
    names, ids, pieces, finish = [], [], [], None
    for chunk in stream:
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                assert tc.index == 0
                if tc.id:
                    ids.append(tc.id)
                if tc.function and tc.function.name:
                    names.append(tc.function.name)
                if tc.function and tc.function.arguments:
                    pieces.append(tc.function.arguments)
            finish = ch.finish_reason or finish
    assert names == ["get_weather"] and len(ids) == 1
    assert len(pieces) > 1  # the arguments stream as they are generated
    _valid("get_weather", "".join(pieces))
    assert finish == "tool_calls"
    whole = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=60,
    )
    assert whole.choices[0].message.tool_calls[0].function.arguments == "".join(pieces)  # type: ignore[index,union-attr]


def _call_turn(city: str, n: int) -> dict[str, Any]:
    args = json.dumps({"city": city, "unit": "celsius"})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": args},
            }
        ],
    }


def test_auto_reads_a_call_the_model_writes(client: openai.OpenAI, model: str) -> None:
    """Two earlier turns that answered a weather question with a call invite the model to
    call again (greedy: the same reply every run); `auto` parses the call out of its text."""
    example: list[Any] = [
        {"role": "user", "content": "What is the weather in Paris?"},
        _call_turn("Paris", 1),
        {"role": "user", "content": "What is the weather in Berlin?"},
        _call_turn("Berlin", 2),
        {"role": "user", "content": "What is the weather in Rome?"},
    ]
    auto = client.chat.completions.create(
        model=model, messages=example, tools=TOOLS, temperature=0, max_tokens=60
    )
    msg = auto.choices[0].message
    assert msg.tool_calls, f"the model did not call a tool: {msg.content!r}"
    (call,) = msg.tool_calls
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    args = _valid("get_weather", call.function.arguments)  # type: ignore[union-attr]
    assert args["city"] == "Rome"
    assert auto.choices[0].finish_reason == "tool_calls" and not msg.content
    # tool_choice none: the same text comes back as content, unparsed
    plain = client.chat.completions.create(
        model=model,
        messages=example,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=60,
    )
    assert not plain.choices[0].message.tool_calls


def test_a_tool_result_is_answered(client: openai.OpenAI, model: str) -> None:
    messages: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_9", "content": "21 degrees and sunny"},
    ]
    out = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, temperature=0, max_tokens=24
    )
    choice = out.choices[0]
    assert choice.message.content and not choice.message.tool_calls
    assert choice.finish_reason in ("stop", "length")
    # The result is part of the prompt: without it the prompt is shorter.
    shorter = client.chat.completions.create(
        model=model, messages=messages[:-1] + [ASK[0]], tools=TOOLS, temperature=0, max_tokens=1
    )
    assert out.usage and shorter.usage
    assert out.usage.prompt_tokens != shorter.usage.prompt_tokens


def test_developer_is_system(client: openai.OpenAI, model: str) -> None:
    def ask(role: str) -> Any:
        return client.chat.completions.create(
            model=model,
            messages=[
                {"role": role, "content": "Answer in one word."},  # type: ignore[misc,list-item,unused-ignore]
                {"role": "user", "content": "Name a colour."},
            ],
            temperature=0,
            max_tokens=8,
        )

    dev, sys_ = ask("developer"), ask("system")
    assert dev.usage.prompt_tokens == sys_.usage.prompt_tokens
    assert dev.choices[0].message.content == sys_.choices[0].message.content


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        (
            {"tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
    ],
)
def test_unsupported_tool_fields_are_named_400s(
    client: openai.OpenAI, model: str, extra: dict[str, Any], param: str
) -> None:
    body: dict[str, Any] = {"tools": TOOLS, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=4, extra_body=body)
    assert err.value.param == param, err.value.message  # type: ignore[attr-defined]


def test_a_tool_turn_needs_its_call_id(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model,
            messages=[*ASK, {"role": "tool", "content": "x"}],  # type: ignore[misc,list-item]
            tools=TOOLS,
            max_tokens=4,
        )
    assert err.value.param == "messages[1].tool_call_id"  # type: ignore[attr-defined]
