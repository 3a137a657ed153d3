"""Hostile grammars through the step engine (issue 12, items 1 and 7): jump-forward is bounded
for a grammar whose forced continuation never ends, handles tokens and forced strings that end
inside a multibyte character, and a fault in one row fails that row, not the step."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from grammar_service.config import GrammarConfig
from grammar_service.jump_forward import whole_chars
from grammar_service.matchers import ErrorCode, RequestMatcher
from grammar_service.server import GrammarServicer, build_servicer
from radixmesh_wire.mask_step import MaskStepBuilder
from radixmesh_wire.packing import unpack_i32
from radixmesh_wire.pb import grammar_pb2 as pb

HOUSES = ["格兰芬多", "赫奇帕奇", "拉文克劳", "斯莱特林"]
HOUSE_REGEX = "(" + "|".join(HOUSES) + ")"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from grammar_service.tokenizer_source import default_tokenizer_dir, load_tokenizer

    return load_tokenizer(default_tokenizer_dir())


@pytest.fixture(scope="module")
def servicer(tokenizer: Any) -> GrammarServicer:
    config = GrammarConfig(
        mask_threads=1,
        compile_threads=1,
        compile_isolation="thread",
        jump_forward_max_bytes=64,
        jump_forward_max_steps=1000,
    )
    return build_servicer(tokenizer, config)


def step(svc: GrammarServicer, state: Any, b: MaskStepBuilder, sid: int) -> pb.MaskStepResult:
    return asyncio.run(svc.run_step(state, b.build(sid)))


def test_whole_chars_cuts_a_partial_character() -> None:
    data = "格".encode()
    assert whole_chars(data) == 3 and whole_chars(data[:2]) == 0
    assert whole_chars(b"ab" + data[:1]) == 2 and whole_chars(b"") == 0


def test_endless_forced_string_is_bounded(servicer: GrammarServicer) -> None:
    """`root ::= "{\\"n\\":" root "}"` forces an infinite string: xgrammar's own search never
    returns (it grows until the host runs out of memory). Ours stops at the byte bound."""
    state = servicer.new_session("endless")
    b = MaskStepBuilder()
    b.bind(1, "ebnf", 'root ::= "{\\"next\\":" root "}"')
    b.want(1, jump_forward=True)
    t0 = time.perf_counter()
    result = step(servicer, state, b, 1)
    print(f"endless forced string bounded in {time.perf_counter() - t0:.2f} s")  # a figure
    assert not result.errors
    jf = result.rows[0].jump_forward
    assert len(jf.text.encode()) == 64 and jf.text.startswith('{"next":{"next":')
    assert unpack_i32(jf.tokens) and jf.rollback == 0


def test_multibyte_choices_walk_every_answer(servicer: GrammarServicer, tokenizer: Any) -> None:
    """Tokens of these answers end inside characters and forced strings start and end inside
    them: before the fix the first such step raised UnicodeDecodeError and failed the stream."""
    for n, answer in enumerate(HOUSES):
        state = servicer.new_session(f"house{n}")
        ids = list(tokenizer.encode(answer, add_special_tokens=False))
        out: list[int] = []
        b = MaskStepBuilder()
        b.bind(7, "regex", HOUSE_REGEX)
        b.want(7, jump_forward=True)
        sid, jumped = 1, False
        while True:
            result = step(servicer, state, b, sid)
            assert not result.errors, result.errors
            row = result.rows[0]
            if row.can_end:
                break
            jf = row.jump_forward
            b = MaskStepBuilder()
            tokens = unpack_i32(jf.tokens)
            if tokens:  # apply the proposal as the scheduler would
                jumped = True
                out = out[: len(out) - jf.rollback] + tokens
                if jf.rollback:
                    b.rollback(7, jf.rollback)
                b.accept(7, tokens)
            else:  # decode the answer's next token
                nxt = ids[len(out)]
                out.append(nxt)
                b.accept(7, [nxt])
            so_far = tokenizer.decode(out).encode().rstrip("\ufffd".encode())
            assert answer.encode().startswith(so_far)
            b.want(7, jump_forward=True)
            sid += 1
        assert tokenizer.decode(out) == answer
        assert jumped, f"{answer}: its tail is forced once its first character is chosen"


def test_a_faulty_row_fails_alone(
    servicer: GrammarServicer, tokenizer: Any, monkeypatch: Any
) -> None:
    """An unexpected exception in one request's grammar work is that row's INTERNAL error; the
    other row of the step still gets its mask."""
    state = servicer.new_session("faulty")
    b = MaskStepBuilder()
    b.bind(1, "regex", "[0-9]+")
    b.bind(2, "regex", "[a-z]+")
    step(servicer, state, b, 1)
    bad = state.table.get(1)

    accept = RequestMatcher.accept

    def boom(self: RequestMatcher, tokens: Any) -> None:
        if self is bad:
            raise UnicodeDecodeError("utf-8", b"\xe6", 0, 1, "unexpected end of data")
        accept(self, tokens)

    monkeypatch.setattr(RequestMatcher, "accept", boom)
    b = MaskStepBuilder()
    b.accept(1, [15])
    b.accept(2, tokenizer.encode("abc", add_special_tokens=False))
    b.want(1)
    b.want(2)
    result = step(servicer, state, b, 2)
    (err,) = result.errors
    assert err.handle == 1 and err.code == ErrorCode.INTERNAL
    assert "UnicodeDecodeError" in err.message
    assert result.rows[0].encoding == pb.MASK_ENCODING_NONE
    assert result.rows[1].encoding != pb.MASK_ENCODING_NONE
