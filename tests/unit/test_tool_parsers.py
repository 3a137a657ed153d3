"""Tool calls read out of model text (hermes and llama3 families), whole and streamed
(character by character: the same content and calls), and the request side of tool calling:
the tool plan, its schema, and the messages a template without tool support receives."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tokenizer_service.http.errors import HttpError
from tokenizer_service.http.protocol import ChatRequest
from tokenizer_service.http.tool_parsers import StreamParser, ToolCall, parse
from tokenizer_service.http.tools import StreamedCalls, plan_tools, prepare_messages, reply_calls

NAMES = {"get_weather", "add"}
HERMES = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
)
LLAMA = (
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
    '{"name": "add", "parameters": {"a": 1, "b": 2}}'
)


def _calls(parsed) -> list[tuple[str, dict]]:  # type: ignore[no-untyped-def]
    return [(c.name, json.loads(c.arguments)) for c in parsed]


def _streamed(parser: str, text: str) -> tuple[str, list[tuple[str, dict]]]:
    p = StreamParser(parser, NAMES)
    content, calls = "", list[ToolCall]()
    for ch in text:
        c, got = p.feed(ch)
        content, calls = content + c, calls + got
    c, got = p.finish()
    return content + c, _calls(calls + got)


WANT = [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]


@pytest.mark.parametrize("parser,text", [("hermes", HERMES), ("llama3", LLAMA)])
def test_calls_whole_and_streamed_agree(parser: str, text: str) -> None:
    whole = parse(parser, text, NAMES)
    assert _calls(whole.calls) == WANT
    assert whole.content == ("Let me check." if parser == "hermes" else "")
    content, calls = _streamed(parser, text)
    assert calls == WANT
    assert content.strip() == whole.content


@pytest.mark.parametrize(
    "parser,text",
    [
        ("hermes", "No tools needed: 1 < 2, and <tool is not a tag."),
        ("hermes", '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>'),
        ("hermes", "<tool_call>not json</tool_call>"),
        ("llama3", "The weather is fine."),
        ("llama3", '{"city": "Paris"}'),  # JSON, but not a call
    ],
)
def test_text_that_is_not_a_call_stays_content(parser: str, text: str) -> None:
    whole = parse(parser, text, NAMES)
    assert whole.calls == [] and whole.content == text
    content, calls = _streamed(parser, text)
    assert calls == [] and content == text


def test_an_unclosed_hermes_call_at_the_end_is_read() -> None:
    text = '<tool_call>{"name": "add", "arguments": {"a": 1}}'
    assert _calls(parse("hermes", text, NAMES).calls) == [("add", {"a": 1})]
    assert _streamed("hermes", text)[1] == [("add", {"a": 1})]


def _chat(**kw) -> ChatRequest:  # type: ignore[no-untyped-def]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        },
        {"type": "function", "function": {"name": "add"}},
    ]
    return ChatRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": tools, **kw}
    )


def test_plans_and_their_schemas() -> None:
    assert plan_tools(_chat(), "hermes").mode == "auto"
    assert plan_tools(_chat(tool_choice="none"), "hermes").active is False
    named = plan_tools(
        _chat(tool_choice={"type": "function", "function": {"name": "get_weather"}}), "hermes"
    )
    assert named.mode == "named" and named.schema()["properties"]["city"] == {"type": "string"}
    req = plan_tools(_chat(tool_choice="required", parallel_tool_calls=False), "hermes")
    s = req.schema()
    assert s["type"] == "array" and s["minItems"] == 1 and s["maxItems"] == 1
    names = [o["properties"]["name"]["const"] for o in s["items"]["anyOf"]]
    assert names == ["get_weather", "add"]
    got = reply_calls(req, '[{"name": "add", "arguments": {"a": 1}}]')
    assert got[0] == "" and _calls(got[1]) == [("add", {"a": 1})]


@pytest.mark.parametrize(
    "kw,param",
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        (
            {"tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
    ],
)
def test_plan_errors_name_the_field(kw: dict, param: str) -> None:
    with pytest.raises(HttpError) as e:
        plan_tools(_chat(**kw), "hermes")
    assert (e.value.status, e.value.param) == (400, param)


def test_tool_choice_without_tools_is_refused() -> None:
    body = ChatRequest.model_validate(
        {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}
    )
    with pytest.raises(HttpError) as e:
        plan_tools(body, "hermes")
    assert e.value.param == "tool_choice"


def test_messages_for_a_template_without_tools() -> None:
    plan = plan_tools(_chat(), "hermes")
    msgs: list[dict[str, Any]] = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    out, tools = prepare_messages(msgs, plan, template_has_tools=False)
    assert tools is None
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.") and "<tools>" in out[0]["content"]
    assert '"get_weather"' in out[0]["content"]
    assert out[2]["content"].startswith("<tool_call>") and '"Paris"' in out[2]["content"]
    assert out[3]["content"] == "<tool_response>\nsunny\n</tool_response>"
    kept, tools = prepare_messages(msgs, plan, template_has_tools=True)
    assert tools == plan.tools and kept[3]["role"] == "tool" and kept[0]["role"] == "system"
    with pytest.raises(HttpError) as e:
        prepare_messages([{"role": "tool", "content": "x"}], plan, True)
    assert e.value.param == "messages[0].tool_call_id"


def test_a_named_call_streams_its_arguments() -> None:
    plan = plan_tools(
        _chat(tool_choice={"type": "function", "function": {"name": "get_weather"}}), "hermes"
    )
    s = StreamedCalls(plan)
    deltas = [*s.feed('{"city"'), *s.feed(': "Paris"}'), *s.finish()]
    head = deltas[0]["tool_calls"][0]
    assert head["function"]["name"] == "get_weather" and head["id"].startswith("call_")
    args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas)
    assert json.loads(args) == {"city": "Paris"}
    assert all(d["tool_calls"][0]["index"] == 0 for d in deltas)
