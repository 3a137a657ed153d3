"""The SSE frame of an OpenAI text event, without building and encoding its object per event.

A streamed chat or completion event that carries only text (no logprobs, no finish, no tool
call: almost every event of a stream) differs from the stream's other text events only in its
choice index and its text. So each choice's frame is split once, at the start of the stream,
into a constant prefix (`data: {"id": ..., "choices": [{"index": i, ..., "content": "`) and
suffix, and an event escapes its text alone (the C string escaper `json.dumps` itself calls).

Invariant (tests/unit/test_openai_frames.py): `TextFrames.frame(i, text)` is byte for byte
`sse.frame(shape.chunk(i, Chunk(text, ...)))` of the object path it replaces, for every text:
JSON escaping is per character, so an escaped text between constant pieces is the encoding of
the whole. The rare events (role, finish, usage, logprobs, tool calls, echo) keep that path.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any


class TextFrames:
    """The text-event frames of one streamed response of `n` choices. `head`: the response's
    constant fields (id, object, created, model), as openai.py's `Shape._head` orders them."""

    def __init__(self, head: dict[str, Any], chat: bool, include_usage: bool, n: int) -> None:
        # the head as json.dumps writes it, without its closing brace: more keys follow
        head_json = json.dumps(head, ensure_ascii=False)
        assert head_json.endswith("}"), head_json
        field = '"delta": {"content": ' if chat else '"text": '
        self.prefix = [
            f'data: {head_json[:-1]}, "choices": [{{"index": {i}, "logprobs": null, '
            f'"finish_reason": null, {field}'
            for i in range(n)
        ]
        self.suffix = ("}" if chat else "") + "}]" + (', "usage": null' if include_usage else "")
        self.suffix += "}\n\n"

    def frame(self, i: int, text: str) -> bytes:
        """The frame of choice `i`'s event carrying `text` (and nothing else)."""
        return (self.prefix[i] + encode_basestring(text) + self.suffix).encode()
