"""Tool calls out of a model's text, one parser per chat-template family (`--tool-call-parser`,
as SGLang and vLLM name them):

- `hermes` (Hermes, Qwen 2.5/3, and the prompt this server writes for templates without tool
  support): each call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; text
  outside the tags is the message content.
- `llama3` (Llama 3.1+ JSON tool calling): the whole reply is a JSON object
  `{"name": ..., "parameters": {...}}` (or several separated by `;`), optionally after
  `<|python_tag|>`; anything else is plain content.

Pure text processing, no I/O. `StreamParser` does the same over a stream of text deltas: it
passes content through as it comes, holding back only what may be the start of a tool call,
and yields each call once it is complete.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

PARSERS = ("hermes", "llama3")
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as the API sends it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class Parsed:
    content: str
    calls: list[ToolCall]


def _call(obj: Any, names: set[str] | None) -> ToolCall | None:
    """A call from a decoded JSON object, or None when it is not one (of a known tool)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if names is not None and obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as JSON text already
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def parse_hermes(text: str, names: set[str] | None = None) -> Parsed:
    calls: list[ToolCall] = []
    for m in _HERMES_BLOCK.finditer(text):
        try:
            call = _call(json.loads(m.group(1)), names)
        except ValueError:
            call = None
        if call is None:  # not a call after all: the whole text is content
            return Parsed(text, [])
        calls.append(call)
    if not calls:
        return Parsed(text, [])
    content = _HERMES_BLOCK.sub("", text).strip()
    return Parsed(content, calls)


def parse_llama3(text: str, names: set[str] | None = None) -> Parsed:
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG) :].strip()
    if not body.startswith("{"):
        return Parsed(text, [])
    calls: list[ToolCall] = []
    decoder = json.JSONDecoder()
    pos = 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except ValueError:
            return Parsed(text, [])
        call = _call(obj, names)
        if call is None:
            return Parsed(text, [])
        calls.append(call)
        pos = end
        while pos < len(body) and body[pos] in " \t\r\n;":
            pos += 1
    return Parsed("", calls)


def parse(parser: str, text: str, names: set[str] | None = None) -> Parsed:
    return parse_llama3(text, names) if parser == "llama3" else parse_hermes(text, names)


def _held(text: str, marker: str) -> int:
    """How many trailing characters of `text` could begin `marker` (kept back from content)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class StreamParser:
    """Incremental `parse`: `feed(delta)` returns (content to send now, calls completed now);
    `finish()` returns what is left at the end. Content is never sent twice, and a call is
    sent once, whole (name and arguments in one `tool_calls` delta)."""

    def __init__(self, parser: str, names: set[str] | None = None) -> None:
        self.parser = parser
        self.names = names
        self.buf = ""  # text not yet sent as content nor parsed as calls
        self.in_call = False
        self.json_mode: bool | None = None  # llama3: None until the reply's start is seen
        self.calls: list[ToolCall] = []

    def feed(self, delta: str) -> tuple[str, list[ToolCall]]:
        self.buf += delta
        if self.parser == "llama3":
            return self._feed_llama3()
        return self._feed_hermes()

    def _feed_llama3(self) -> tuple[str, list[ToolCall]]:
        if self.json_mode is None:
            head = self.buf.lstrip()
            if not head:
                return "", []
            maybe_tag = _PYTHON_TAG.startswith(head) or head.startswith(_PYTHON_TAG)
            if head.startswith("{") or maybe_tag:
                self.json_mode = True
            else:
                self.json_mode = False
        if self.json_mode:
            return "", []  # the whole reply is parsed at the end
        out, self.buf = self.buf, ""
        return out, []

    def _feed_hermes(self) -> tuple[str, list[ToolCall]]:
        content, calls = "", list[ToolCall]()
        while True:
            if not self.in_call:
                at = self.buf.find(_OPEN)
                if at < 0:
                    keep = _held(self.buf, _OPEN)
                    content += self.buf[: len(self.buf) - keep]
                    self.buf = self.buf[len(self.buf) - keep :]
                    return content, calls
                content += self.buf[:at]
                self.buf = self.buf[at:]
                self.in_call = True
            end = self.buf.find(_CLOSE)
            if end < 0:
                return content, calls
            block, self.buf = self.buf[: end + len(_CLOSE)], self.buf[end + len(_CLOSE) :]
            self.in_call = False
            got = parse_hermes(block, self.names)
            if got.calls:
                calls += got.calls
                self.calls += got.calls
            else:
                content += block  # not a call after all: it was content

    def finish(self) -> tuple[str, list[ToolCall]]:
        rest, self.buf = self.buf, ""
        if not rest:
            return "", []
        got = parse(self.parser, rest, self.names)
        self.calls += got.calls
        return got.content, got.calls
