"""Held updates (`TextStream.on_delta(hold=True)`: more are queued behind them) are decoded
once, together, when their chunk is released: the detokenizer's work per event, not per
update (issue 27). The text and ids streamed are those of the update-by-update path; with
stop strings every update is still decoded as it comes (a stop ends the output where it is)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from radixmesh_wire.pb import api_pb2, scheduler_pb2
from tokenizer_service.events import Chunk
from tokenizer_service.routing.deltas import Update
from tokenizer_service.text_stream import TextStream
from tokenizer_service.tokenization import Tokenization

TEXT = (
    'Caf\u00e9 "quotes" \U0001f916\U0001f680 \u6771\u4eac\u30bf\u30ef\u30fc, na\u00efve.\n'
    "Numbers 12345 and code `x = f(y) + 1;` end. STOP here and after."
)


@pytest.fixture(scope="module")
def tok(model_dir: Path) -> Tokenization:
    return Tokenization(model_dir)


def _update(ids: list[int], finish: bool = False) -> Update:
    u = Update()
    u.token_ids = list(ids)
    if finish:
        u.extras = scheduler_pb2.DeltaExtras(finish_reason=api_pb2.FINISH_REASON_LENGTH)
    return u


class _Counted:
    """The stream's decoder, counting its calls."""

    def __init__(self, stream: TextStream) -> None:
        self.inner = stream.detok.decode
        self.calls = 0
        stream.detok.decode = self

    def __call__(self, ids: Sequence[int]) -> str:
        self.calls += 1
        return self.inner(ids)


def _stream(tok: Tokenization, stops: Sequence[str] = ()) -> TextStream:
    sampling = api_pb2.SamplingParams(stop=list(stops), skip_special_tokens=True)
    return TextStream(tok, tok.encode("Say something:"), sampling, True, 1)


def _run(s: TextStream, ids: list[int], group: int) -> tuple[list[Chunk], bool]:
    """One token per update; every `group` updates arrive queued together (the first ones
    held), the last update finishes. Returns the chunks and whether it ended early."""
    chunks: list[Chunk] = []
    for k, t in enumerate(ids):
        last = k == len(ids) - 1
        hold = not last and (k + 1) % group != 0
        chunk, done = s.on_delta(_update([t], finish=last), hold=hold)
        if chunk is not None:
            chunks.append(chunk)
        if done:
            return chunks, not last
    return chunks, False


@pytest.mark.parametrize("group", [2, 3, 7, 64])
def test_held_updates_decode_once_per_chunk(tok: Tokenization, group: int) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    s = _stream(tok)
    counted = _Counted(s)
    chunks, early = _run(s, ids, group)
    assert not early
    released = -(-len(ids) // group)  # chunks released: one per group
    # two decodes per release and two for the final flush; per update it was 2 * len(ids)
    assert counted.calls == 2 * released + 2
    assert "".join(c.text for c in chunks) == tok.decode(ids) == s.text
    assert [t for c in chunks for t in c.token_ids] == ids
    # the same stream, update by update, streams the same text and ids
    ref = _stream(tok)
    ref_chunks, _ = _run(ref, ids, 1)
    assert "".join(c.text for c in ref_chunks) == "".join(c.text for c in chunks)
    assert ref.complete(api_pb2.LogprobOptions()) == s.complete(api_pb2.LogprobOptions())


@pytest.mark.parametrize("group", [3, 64])
def test_stop_strings_still_cut_at_their_update(tok: Tokenization, group: int) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    ref = _stream(tok, ["STOP"])
    _, ref_early = _run(ref, ids, 1)
    s = _stream(tok, ["STOP"])
    chunks, early = _run(s, ids, group)
    assert early and ref_early
    assert s.text == ref.text == TEXT[: TEXT.index("STOP")]
    assert s.ids == ref.ids  # no id after the one that completed the stop
    assert "".join(c.text for c in chunks) == s.text


def test_held_text_goes_out_before_a_failure(tok: Tokenization) -> None:
    ids = tok.encode("Hello there, general Kenobi", add_special_tokens=False)
    s = _stream(tok)
    for t in ids:
        chunk, done = s.on_delta(_update([t]), hold=True)
        assert chunk is None and not done
    held = s.held_chunk()
    assert held is not None
    assert held.text == tok.decode(ids) and held.token_ids == ids


def test_rollback_of_held_ids(tok: Tokenization) -> None:
    ids = tok.encode("one two three four five", add_special_tokens=False)
    s = _stream(tok)
    for t in ids[:4]:
        s.on_delta(_update([t]), hold=True)
    u = _update(ids[4:], finish=True)
    u.rollback = 2  # a jump-forward dropped the last two held ids
    chunk, done = s.on_delta(u)
    kept = ids[:2] + ids[4:]
    assert done and s.ids == kept and s.text == tok.decode(kept)
    assert chunk is not None and chunk.token_ids == kept and chunk.text == s.text
