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
