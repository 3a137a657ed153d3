"""The OpenAI stream's pre-split text frames (openai_frames.TextFrames) against the object
path they replace (`Shape.chunk` encoded by `sse.frame`): the same bytes, so the same JSON,
for every text; and a whole streamed response (role, text events, finish, usage, [DONE];
an error) as the object path writes it, frame for frame."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any, cast

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenizer_service.core import FrontDoor, GenerateError, GenerateInput
from tokenizer_service.events import Chunk, Complete, Event
from tokenizer_service.http.openai import Shape
from tokenizer_service.http.openai_params import OpenAIRequest, openai_error
from tokenizer_service.http.openai_stream import OpenAIStream
from tokenizer_service.http.sse import DONE, frame

TRICKY = [
    "",
    "plain",
    " leading space",
    'a "quoted" word',
    "back\\slash \\\\ double \\n not a newline",
    "new\nline\r\nand\ttab",
    "control \x00\x01\x08\x0b\x0c\x1b\x1f and del \x7f",
    "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f680 \u00a0nbsp",
    "line and paragraph separators \u2028\u2029",
    '</script><!-- {"json": [1, 2]} -->',
    "\ufffd replacement",
    "\\u0041 looks escaped",
]


class _Tok:
    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


class _Core:
    """What the stream reads of the core: `generate` replays a script; `tok` for echo."""

    def __init__(self, script: list[Event | GenerateError], **by_rid: list[Event]) -> None:
        self.script = script
        self.by_rid = by_rid  # other scripts, per request id (several choices)
        self.tok = _Tok()

    async def generate(self, inp: GenerateInput) -> AsyncGenerator[Event, None]:
        for ev in self.by_rid.get(inp.rid, self.script):
            if isinstance(ev, GenerateError):
                raise ev
            yield ev


class _Recorder:
    """An opened SSE response: the bytes of every write, in order."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.eof = False

    async def write(self, data: bytes) -> None:
        assert not self.eof
        self.writes.append(data)

    async def write_eof(self, data: bytes = b"") -> None:
        self.writes.append(data)
        self.eof = True


def _shape(chat: bool, usage: bool, core: Any = None) -> Shape:
    req = OpenAIRequest(model="m", inputs=[GenerateInput()], stream=True, include_usage=usage)
    return Shape(cast(FrontDoor, core or _Core([])), req, 'model "x"\\', chat, None, "rid-1")


@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("text", TRICKY)
def test_text_frame_is_the_object_frame(text: str, chat: bool, usage: bool) -> None:
    shape = _shape(chat, usage)
    frames = shape.text_frames(3)
    for i in range(3):
        ev = Chunk(text, [7], [])
        old = frame(shape.chunk(i, ev))
        new = frames.frame(i, text)
        assert new == old
        assert new.startswith(b"data: ") and new.endswith(b"\n\n")
        assert json.loads(new[6:]) == shape.chunk(i, ev)  # the object the SDK reads


@settings(max_examples=150, deadline=None)
@given(text=st.text(), chat=st.booleans(), usage=st.booleans())
def test_text_frame_any_text(text: str, chat: bool, usage: bool) -> None:
    shape = _shape(chat, usage)
    assert shape.text_frames(1).frame(0, text) == frame(shape.chunk(0, Chunk(text, [], [])))


def _complete(text: str, finish: str = "length", stop: str = "") -> Complete:
    return Complete(text, [1, 2, 3], finish, stop, [9, 9], 1, [], [], 0)


def _object_path(shape: Shape, script: list[Event | GenerateError]) -> list[bytes]:
    """The frames the object path (before the pre-split frames) wrote for one choice."""
    out = [frame(shape.chunk(0, role=True))] if shape.chat else []
    results = []
    for ev in script:
        if isinstance(ev, GenerateError):
            out.append(frame(openai_error(ev).body()))
            return [*out, DONE]
        if isinstance(ev, Chunk):
            if ev.text or ev.logprobs:
                out.append(frame(shape.chunk(0, ev)))
        else:
            results.append(ev)
            out.append(frame(shape.chunk(0, finish=ev)))
    if shape.req.include_usage:
        out.append(frame(shape.usage_chunk(results)))
    return [*out, DONE]


def _events(data: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in data.split(b"\n\n") if e]


SCRIPTS: dict[str, list[Event | GenerateError]] = {
    "tricky texts, length": [
        *(Chunk(t, [k], []) for k, t in enumerate(TRICKY)),
        _complete("".join(TRICKY)),
    ],
    "empty delta skipped, stop string": [
        Chunk("a", [1], []),
        Chunk("", [2], []),
        Chunk('"end"\n', [3], []),
        _complete('a"end"\n', "stop", "\n\n"),
    ],
    "error mid-stream": [
        Chunk("part", [1], []),
        GenerateError(grpc.StatusCode.RESOURCE_EXHAUSTED, "max_new_tokens too large", "x"),
    ],
}


@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_stream_is_the_object_path(name: str, chat: bool, usage: bool) -> None:
    script = SCRIPTS[name]
    core = _Core(script)
    shape = _shape(chat, usage, core)
    rec = _Recorder()
    stream = OpenAIStream(cast(FrontDoor, core), [GenerateInput(rid="rid-1")], shape)
    asyncio.run(stream.run(cast(Any, rec)))
    assert rec.eof
    got = b"".join(rec.writes)
    want = _object_path(shape, script)
    assert _events(got) == want
    parsed = [json.loads(e[6:]) for e in want[:-1]]
    assert [json.loads(e[6:]) for e in _events(got)[:-1]] == parsed
    if "error" not in name:
        finish = next(p for p in parsed if p.get("choices") and p["choices"][0]["finish_reason"])
        end = script[-1]
        assert isinstance(end, Complete)
        assert finish["choices"][0]["finish_reason"] == end.finish_reason
    if usage and "error" not in name:
        assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["completion_tokens"] == 3
    # the last finish (or the error), usage and [DONE] leave in the response's final write
    last = _events(rec.writes[-1])
    assert last == want[-(2 if "error" in name else 2 + usage) :]


@pytest.mark.parametrize("chat", [True, False])
def test_two_choices_are_the_object_path(chat: bool) -> None:
    """n = 2 (through `merged`): each choice's frames are the object path's, in its order;
    the second finish, usage and [DONE] leave in the final write."""
    a: list[Event] = [Chunk("a\n", [1], []), Chunk('"b"', [2], []), _complete('a\n"b"')]
    b: list[Event] = [Chunk("\u00e9\\", [3], []), _complete("\u00e9\\", "stop")]
    core = _Core([], r0=a, r1=b)
    req = OpenAIRequest(model="m", inputs=[], n=2, stream=True, include_usage=True)
    shape = Shape(cast(FrontDoor, core), req, "m", chat, None, "r")
    rec = _Recorder()
    inputs = [GenerateInput(rid="r0"), GenerateInput(rid="r1")]
    asyncio.run(OpenAIStream(cast(FrontDoor, core), inputs, shape).run(cast(Any, rec)))
    got = [json.loads(e[6:]) for e in _events(b"".join(rec.writes))[:-1]]
    for i, script in enumerate([a, b]):
        want = [shape.chunk(i, role=True)] if chat else []
        want += [
            shape.chunk(i, ev) if isinstance(ev, Chunk) else shape.chunk(i, finish=ev)
            for ev in script
        ]
        assert [g for g in got if g["choices"] and g["choices"][0]["index"] == i] == want
    assert got[-1] == shape.usage_chunk([cast(Complete, a[-1]), cast(Complete, b[-1])])
    last = _events(rec.writes[-1])
    assert len(last) == 3 and last[-1] == DONE and b'"finish_reason": null' not in last[0]
