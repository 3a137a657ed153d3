"""Tool calling on the OpenAI chat API: what a request's `tools`, `tool_choice` and
`parallel_tool_calls` mean for its prompt, its grammar and its reply.

- Prompt: the model's own chat template renders the tools when it knows them (it mentions
  `tools`); for a template that does not, the tools go into the system message in the Hermes
  format (`<tools>` JSON, replies in `<tool_call>` tags), assistant turns' calls become
  `<tool_call>` text and `tool` results `<tool_response>` user turns, so the `hermes` parser
  reads the reply. Role `developer` is `system`.
- `auto`: free text, tool calls parsed out of it (`tool_parsers`); `none`: tools neither
  rendered nor parsed.
- `required` / a named function: the reply is generated under a JSON schema through the
  grammar service, so it always parses and its arguments validate: a named function's reply is
  its arguments object; `required`'s an array of `{"name", "arguments"}` (one item when
  `parallel_tool_calls` is false).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tokenizer_service.http.errors import HttpError
from tokenizer_service.http.protocol import ChatRequest, NamedToolChoice
from tokenizer_service.http.tool_parsers import (
    StreamParser,
    ToolCall,
    parse,
)

_HERMES_PROMPT = (
    "You may call one or more functions to assist with the user query. You are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, '
    '"arguments": <args-json-object>}}\n</tool_call>'
)


@dataclass
class ToolPlan:
    """What one chat request's tool fields ask for (`mode`: none, auto, required, named)."""

    tools: list[dict[str, Any]]
    mode: str = "none"
    name: str = ""  # the function of mode "named"
    parallel: bool = True
    parser: str = "hermes"
    names: set[str] = field(default_factory=set)

    @property
    def constrained(self) -> bool:
        return self.mode in ("required", "named")

    @property
    def active(self) -> bool:
        return self.mode != "none"

    def params_schema(self, name: str) -> dict[str, Any]:
        for t in self.tools:
            if t["function"]["name"] == name:
                p = t["function"].get("parameters")
                return p if p else {"type": "object"}
        raise KeyError(name)

    def schema(self) -> dict[str, Any]:
        """The JSON schema the reply is generated under (modes required and named)."""
        if self.mode == "named":
            return self.params_schema(self.name)
        one = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": t["function"]["name"]},
                    "arguments": self.params_schema(t["function"]["name"]),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in self.tools
        ]
        items = one[0] if len(one) == 1 else {"anyOf": one}
        out: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
        if not self.parallel:
            out["maxItems"] = 1
        return out


def plan_tools(b: ChatRequest, parser: str) -> ToolPlan:
    """The tool plan of a chat body; 400 naming the field for what cannot be served."""
    tools = [t.model_dump(by_alias=True, exclude_none=True) for t in b.tools or []]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise HttpError(400, "tools: two tools have the same name", param="tools")
    plan = ToolPlan(tools, parallel=b.parallel_tool_calls is not False, parser=parser)
    plan.names = set(names)
    choice = b.tool_choice
    if choice is None:
        plan.mode = "auto" if tools else "none"
    elif isinstance(choice, NamedToolChoice):
        plan.mode, plan.name = "named", choice.function.name
    else:
        plan.mode = choice
    if plan.mode != "none" and not tools:
        raise HttpError(400, f"tool_choice {plan.mode!r} needs tools", param="tool_choice")
    if plan.mode == "named" and plan.name not in plan.names:
        raise HttpError(
            400,
            f"tool_choice names the function {plan.name!r}, which is not among the tools "
            f"({', '.join(names)})",
            param="tool_choice",
        )
    if plan.constrained:
        for other in ("response_format", "regex", "ebnf", "json_schema"):
            if getattr(b, other) is not None:
                raise HttpError(
                    400,
                    f"tool_choice {plan.mode!r} generates the call under its own schema: "
                    f"drop {other}",
                    param=other,
                )
    return plan


def prepare_messages(
    messages: list[dict[str, Any]], plan: ToolPlan, template_has_tools: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages for the chat template, tools to pass it or None)."""
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        if m["role"] == "developer":
            m["role"] = "system"
        if m["role"] == "tool" and not m.get("tool_call_id"):
            raise HttpError(
                400,
                f"messages[{i}] has role 'tool' but no tool_call_id: name the call it answers",
                param=f"messages[{i}].tool_call_id",
            )
        out.append(m)
    render = plan.active and plan.tools
    if template_has_tools:
        return out, plan.tools if render else None
    return _hermes_messages(out, plan.tools if render else []), None


def _hermes_messages(
    msgs: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Tools and tool turns as text, for a chat template that knows neither."""
    out: list[dict[str, Any]] = []
    for m in msgs:
        calls = m.pop("tool_calls", None)
        if calls:
            text = "\n".join(_call_text(c["function"]) for c in calls)
            m["content"] = (m.get("content") or "") + ("\n" if m.get("content") else "") + text
        if m["role"] == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        out.append({"role": m["role"], "content": m.get("content") or ""})
    if tools:
        prompt = _HERMES_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _call_text(f: dict[str, Any]) -> str:
    call = json.dumps({"name": f["name"], "arguments": f["arguments"]}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def reply_calls(plan: ToolPlan, text: str) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole reply."""
    if plan.mode == "named":
        return "", [ToolCall(plan.name, text.strip())]
    if plan.mode == "required":
        try:
            items = json.loads(text)
        except ValueError:  # cut by the token limit: what there is, as content
            return text, []
        calls = [
            ToolCall(it["name"], json.dumps(it["arguments"], ensure_ascii=False)) for it in items
        ]
        return "", calls
    got = parse(plan.parser, text, plan.names)
    calls = got.calls if plan.parallel else got.calls[:1]
    return got.content, calls


class StreamedCalls:
    """One choice's streamed reply as chat deltas: content as it comes, each tool call as a
    `tool_calls` delta (a named function's arguments stream as they are generated)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.sent = 0  # tool calls sent
        self.parser = StreamParser(plan.parser, plan.names) if plan.mode == "auto" else None
        self.text = ""  # required: the whole reply, parsed at the end
        self.named: ToolCall | None = None

    def _deltas(self, content: str, calls: list[ToolCall]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"content": content}] if content else []
        for c in calls:
            if not self.plan.parallel and self.sent:
                break
            out.append({"tool_calls": [{"index": self.sent, **c.as_dict()}]})
            self.sent += 1
        return out

    def feed(self, text: str) -> list[dict[str, Any]]:
        if self.plan.mode == "named":
            if self.named is None:
                self.named = ToolCall(self.plan.name, "")
                head = {"index": 0, **self.named.as_dict()}
                self.sent = 1
                return [{"tool_calls": [head]}, *self._args(text)]
            return self._args(text)
        if self.parser is None:
            self.text += text
            return []
        return self._deltas(*self.parser.feed(text))

    def _args(self, text: str) -> list[dict[str, Any]]:
        return [{"tool_calls": [{"index": 0, "function": {"arguments": text}}]}] if text else []

    def finish(self) -> list[dict[str, Any]]:
        if self.plan.mode == "named":
            return self.feed("") if self.named is None else []
        if self.parser is None:
            content, calls = reply_calls(self.plan, self.text)
            return self._deltas(content, calls)
        return self._deltas(*self.parser.finish())
