"""SGLang-native streaming frames built from pre-encoded text and ids parse to exactly what
encoding the cumulative response object would give, for text that needs JSON escaping and for
a jump-forward that retokenizes ids already sent."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from tokenizer_service.events import Chunk
from tokenizer_service.http.sglang import _Meta, _Request


def _parse(frame: bytes) -> Any:
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    return json.loads(frame[6:-2])


def test_partial_frames_match_the_cumulative_object() -> None:
    req = _Request()
    req.inputs = [SimpleNamespace(rid="a"), SimpleNamespace(rid="b")]  # type: ignore[list-item]
    meta = _Meta(SimpleNamespace(), req)  # type: ignore[arg-type]
    chunks = [
        Chunk('He said "hi"\n', [1, 2], []),
        Chunk("\\ tab\t é 漢字 \u2028", [3], []),
        Chunk("", [], []),
        Chunk(" {json}", [9, 10], [], rollback=2),  # ids 2, 3 retokenized into 9, 10
    ]
    for ev in chunks:
        meta.add(0, ev)
        got = _parse(meta.partial_frame(0))
        want = json.loads(json.dumps(meta.partial(0)))
        for d in (got, want):
            d["meta_info"].pop("e2e_latency")
        assert got == want
    assert got["text"] == 'He said "hi"\n\\ tab\t é 漢字 \u2028 {json}'
    assert got["output_ids"] == [1, 9, 10]
    assert _parse(meta.partial_frame(1))["output_ids"] == []


def test_partial_frames_are_the_bytes_of_the_object_path(monkeypatch: Any) -> None:
    """Byte for byte what the cumulative object's JSON is (json.dumps, ensure_ascii=False),
    but for the ids' separators (no space, as this path always wrote them)."""
    import time

    from tokenizer_service.http.sse import frame

    monkeypatch.setattr(time, "perf_counter", lambda: 12.5)
    req = _Request()
    req.inputs = [SimpleNamespace(rid='r "1" \u00e9')]  # type: ignore[list-item]
    meta = _Meta(SimpleNamespace(), req)  # type: ignore[arg-type]
    meta.t0 = 10.25
    for ev in (
        Chunk('caf\u00e9 \U0001f680 "q" \\ \n\t\u2028', [5, 6], []),
        Chunk("", [7], []),
        Chunk(" \u65e5\u672c", [8, 9], [], rollback=1),
    ):
        meta.add(0, ev)
        p = meta.partial(0)
        want = (  # as json.dumps writes it, but the ids without spaces (as they always were)
            f'data: {{"text": {json.dumps(p["text"], ensure_ascii=False)}, "output_ids": '
            f'[{",".join(map(str, p["output_ids"]))}], "meta_info": {{"id": '
            f'{json.dumps(p["meta_info"]["id"])}, "finish_reason": null, '
            f'"completion_tokens": {len(p["output_ids"])}, "e2e_latency": 2.25}}}}\n\n'
        )
        assert meta.partial_frame(0) == want.encode()
        assert _parse(frame(p)) == _parse(want.encode())


class _Resp:
    """The response's writes: each `write` is one socket send, as is `write_eof`'s data."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.eof: bytes | None = None

    async def write(self, data: bytes) -> None:
        self.writes.append(data)

    async def write_eof(self, data: bytes = b"") -> None:
        self.eof = data


def test_a_stream_ends_with_one_write(monkeypatch: Any) -> None:
    """One write per event that changes the response; the final result and [DONE] leave with
    the chunked EOF in ONE write (before: three sends at the end of every stream)."""
    import asyncio

    from tokenizer_service.events import Complete
    from tokenizer_service.http import sglang
    from tokenizer_service.http.sse import DONE

    done = Complete("ab", [1, 2], "length", "", [0], 0, [], [], 0)
    events = [Chunk("a", [1], []), Chunk("", [], []), Chunk("b", [2], []), done]

    class Core:
        async def generate(self, inp: Any) -> Any:
            for ev in events:
                yield ev

    resp = _Resp()

    async def open_stream(request: Any) -> _Resp:
        return resp

    monkeypatch.setattr(sglang, "open_stream", open_stream)
    req = _Request()
    req.stream = True
    req.inputs = [SimpleNamespace(rid="x")]  # type: ignore[list-item]
    api = sglang.SGLangApi(Core(), "m", {})  # type: ignore[arg-type]
    meta = _Meta(Core(), req)  # type: ignore[arg-type]
    asyncio.run(api._stream(None, req, meta))  # type: ignore[arg-type]
    texts = [_parse(w)["text"] for w in resp.writes]
    assert texts == ["a", "ab"]  # the empty chunk sent nothing
    assert resp.eof is not None and resp.eof.endswith(DONE)
    last = _parse(resp.eof[: -len(DONE)])
    assert last["text"] == "ab" and last["meta_info"]["finish_reason"] == {
        "type": "length",
        "length": 2,
    }
