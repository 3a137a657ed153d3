"""Incremental detokenization equals one-shot decoding, for byte-level BPE and UTF-8."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenizer_service.detokenizer import IncrementalDetokenizer
from tokenizer_service.stop_strings import StopMatcher
from tokenizer_service.tokenization import Tokenization

TEXTS = [
    "Hello, world! The capital of France is Paris.",
    "Emoji 🤖🚀 and accents: café, naïve, Zürich; CJK: 東京タワー, 한국어.",
    "  leading spaces\n\n\tand tabs  ",
    "ÆØÅ — “quotes” … ∑∫√ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
]


@pytest.fixture(scope="module")
def tok(model_dir: Path) -> Tokenization:
    return Tokenization(model_dir)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 2, 3])
def test_incremental_matches_full_decode(tok: Tokenization, text: str, step: int) -> None:
    prompt = tok.encode("Say something:")
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok.decode, prompt)
    pieces = [detok.push(ids[i : i + step]) for i in range(0, len(ids), step)]
    pieces.append(detok.flush())
    assert "".join(pieces) == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces[:-1])


def test_partial_utf8_is_held_back(tok: Tokenization) -> None:
    ids = tok.encode("🤖", add_special_tokens=False)
    assert len(ids) > 1, "the emoji should span several byte-level tokens"
    detok = IncrementalDetokenizer(tok.decode)
    assert detok.push(ids[:1]) == ""
    rest = "".join(detok.push([i]) for i in ids[1:])
    assert rest == "🤖"


def test_stop_matcher_finds_earliest_and_holds_back() -> None:
    m = StopMatcher(["\n\n", "END"])
    assert m.find("abc END x\n\ny") == (4, "END")
    assert m.find("abc") is None
    assert m.safe_length("hello E") == len("hello ")
    assert m.safe_length("hello EN") == len("hello ")
    assert m.safe_length("hello\n") == len("hello")
    assert m.safe_length("hello") == 5
    # a match straddling two chunks is found when searching from the second chunk's start
    assert m.find("abcEN" + "D", start=5) == (3, "END")


def test_the_detokenizer_keeps_no_text_and_a_rollback_rederives_it(tok: Tokenization) -> None:
    """Its caller owns the text: a push copies no whole text (issue 27), and a jump-forward
    rollback re-derives the stream's text from the kept ids in one push."""
    from radixmesh_wire.pb import api_pb2
    from tokenizer_service.routing.deltas import Update
    from tokenizer_service.text_stream import TextStream

    detok = IncrementalDetokenizer(tok.decode)
    detok.push(tok.encode("caf\u00e9 au lait", add_special_tokens=False))
    assert not hasattr(detok, "text")
    ids = tok.encode("Jump \u65e5\u672c forward, and on.", add_special_tokens=False)
    stream = TextStream(tok, [1, 2], api_pb2.SamplingParams(), True, 1)
    for k in range(0, len(ids), 2):
        u = Update()
        u.token_ids = ids[k : k + 2]
        if k == 4:  # the tail retokenized: 3 delivered ids dropped, sent again
            u.rollback, u.token_ids = 3, ids[1:6]
        stream.on_delta(u)
    assert stream.ids == ids and stream.text == tok.decode(ids)
