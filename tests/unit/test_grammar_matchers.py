"""Matchers through the step engine (no gRPC): accept, masks, jump-forward with
retokenization, rollback, replay after a restart, terminated rows and per-row errors."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from grammar_service.config import GrammarConfig
from grammar_service.matchers import ErrorCode
from grammar_service.server import GrammarServicer, build_servicer
from grammar_service.steps import StepFormatError
from grammar_service.suite import PAPER_REGEX
from model_service.mask_device import decode_rows
from radixmesh_wire.mask_rows import MaskEncoding
from radixmesh_wire.mask_step import MaskStepBuilder
from radixmesh_wire.packing import pack_i32, unpack_i32
from radixmesh_wire.pb import grammar_pb2 as pb

EOS = 2  # SmolLM2's <|im_end|>, the tokenizer's only stop token


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The embedded model's tokenizer, built once and cached under the temp dir."""
    from grammar_service.tokenizer_source import default_tokenizer_dir, load_tokenizer

    return load_tokenizer(default_tokenizer_dir())


@pytest.fixture(scope="module")
def servicer(tokenizer: Any) -> GrammarServicer:
    return build_servicer(tokenizer, GrammarConfig(mask_threads=1, compile_threads=1))


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())  # type: ignore[arg-type]


class Session:
    """One in-process session: `step(builder)` runs a MaskStep like the stream would."""

    def __init__(self, svc: GrammarServicer) -> None:
        self.svc = svc
        self.state = svc.new_session("test")
        self.step_id = 0

    async def step(self, b: MaskStepBuilder) -> pb.MaskStepResult:
        self.step_id += 1
        result = await self.svc.run_step(self.state, b.build(self.step_id))
        assert result.step_id == self.step_id
        return result


def allowed_ids(row: pb.MaskRow, vocab: int) -> list[int]:
    words = decode_rows([row], vocab)[0].numpy()
    bits = np.unpackbits(words.view(np.uint8), bitorder="little", count=vocab)
    return [int(i) for i in np.flatnonzero(bits)]


def enc(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_paper_regex_with_jump_forward(servicer: GrammarServicer, tokenizer: Any) -> None:
    vocab = servicer.engine.vocab_size

    async def main() -> None:
        s, b = Session(servicer), MaskStepBuilder()
        b.bind(1, "regex", PAPER_REGEX)
        b.want(1, jump_forward=True)
        (row,) = (await s.step(b)).rows
        # Only '{' and '{"' may start the output; the constant prefix is one jump.
        assert [tokenizer.decode([t]) for t in allowed_ids(row, vocab)] == ["{", '{"']
        assert row.encoding == pb.MASK_ENCODING_ALLOWED and not row.can_end
        jf = row.jump_forward
        assert jf.text == '{"summary": "' and jf.rollback == 0
        out = unpack_i32(jf.tokens)
        assert out == enc(tokenizer, '{"summary": "')  # the tokenizer's own split (B.2)

        body = enc(tokenizer, "Good job") + enc(tokenizer, ".")
        b.accept(1, out + body)
        b.want(1, jump_forward=True)
        (row,) = (await s.step(b)).rows
        out += body
        jf = row.jump_forward
        assert jf.text == '", "grade": "'
        # Retokenization merges the sampled "." with the forced '",' -> roll back one token.
        new = unpack_i32(jf.tokens)
        assert jf.rollback == 1 and tokenizer.decode([new[0]]) == '.",'
        assert tokenizer.decode(out[: len(out) - jf.rollback] + new) == (
            tokenizer.decode(out) + jf.text
        )
        b.rollback(1, jf.rollback)
        b.accept(1, new + enc(tokenizer, "A+") + enc(tokenizer, '"}'))
        b.want(1)
        out = out[: len(out) - jf.rollback] + new + enc(tokenizer, "A+") + enc(tokenizer, '"}')
        result = await s.step(b)
        assert not result.errors
        (row,) = result.rows
        assert row.can_end and allowed_ids(row, vocab) == [EOS]
        assert re.fullmatch(PAPER_REGEX, tokenizer.decode(out))
        b.accept(1, [EOS])
        b.want(1)
        (row,) = (await s.step(b)).rows
        assert row.terminated and row.can_end and allowed_ids(row, vocab) == [EOS]

    run(main)


def test_rollback_matches_a_fresh_matcher(servicer: GrammarServicer, tokenizer: Any) -> None:
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'
    toks = enc(tokenizer, '{"a": 12')

    async def main() -> None:
        s, b = Session(servicer), MaskStepBuilder()
        b.bind(1, "json_schema", schema)
        b.bind(2, "json_schema", schema)
        b.accept(1, toks)
        b.accept(2, toks[:-2])
        await s.step(b)
        b.rollback(1, 2)
        b.want(1)
        b.want(2)
        one, two = (await s.step(b)).rows
        assert (one.encoding, one.data) == (two.encoding, two.data)
        b.rollback(1, 10**6)
        b.want(1)
        result = await s.step(b)
        assert result.rows[0].encoding == pb.MASK_ENCODING_NONE
        assert [(e.handle, e.code) for e in result.errors] == [(1, ErrorCode.ROLLBACK)]

    run(main)


def test_replay_after_restart_rebuilds_the_same_state(
    servicer: GrammarServicer, tokenizer: Any
) -> None:
    text = '{"summary": "All good'
    toks = enc(tokenizer, text)

    async def main() -> None:
        before, b = Session(servicer), MaskStepBuilder()
        b.bind(5, "regex", PAPER_REGEX)
        await before.step(b)
        for t in toks:  # one token per step, like decoding
            b.accept(5, [t])
            b.want(5, jump_forward=True)
            old = (await before.step(b)).rows[0]
        after = Session(servicer)  # a restarted service: the scheduler re-binds with replay
        b.bind(5, "regex", PAPER_REGEX, replay=toks)
        b.want(5, jump_forward=True)
        new = (await after.step(b)).rows[0]
        assert new == old

    run(main)


def test_row_errors(servicer: GrammarServicer, tokenizer: Any) -> None:
    async def main() -> None:
        s, b = Session(servicer), MaskStepBuilder()
        b.bind(1, "regex", "(yes|no)")
        b.bind(2, "regex", "(unclosed")
        b.bind(3, "json_schema", '{"type": "objec"}')
        b.accept(1, enc(tokenizer, "yes") + enc(tokenizer, "yes"))  # second "yes" rejected
        b.accept(9, [1])  # never bound
        for h in (1, 2, 3, 9):
            b.want(h)
        result = await s.step(b)
        errors = {e.handle: e for e in result.errors}
        assert errors[1].code == ErrorCode.TOKEN_REJECTED and errors[1].accepted == 1
        assert errors[2].code == ErrorCode.COMPILE and "parenthesis" in errors[2].message
        assert errors[3].code == ErrorCode.COMPILE and "objec" in errors[3].message
        assert errors[9].code == ErrorCode.UNKNOWN_HANDLE
        assert [r.encoding for r in result.rows] == [pb.MASK_ENCODING_NONE] * 4
        # The matcher stayed after the accepted "yes": only EOS may follow.
        b.bind(1, "regex", "x")
        b.want(1)
        result = await s.step(b)
        assert result.errors[0].code == ErrorCode.ALREADY_BOUND
        b.want(1)
        (row,) = (await s.step(b)).rows
        assert row.can_end and allowed_ids(row, servicer.engine.vocab_size) == [EOS]

    run(main)


def test_release_and_rebind_in_one_step(servicer: GrammarServicer, tokenizer: Any) -> None:
    async def main() -> None:
        s, b = Session(servicer), MaskStepBuilder()
        b.bind(4, "regex", "(yes|no)")
        b.accept(4, enc(tokenizer, "yes"))
        await s.step(b)
        b.release(4)
        b.bind(4, "regex", "(maybe)")
        b.want(4, jump_forward=True)
        result = await s.step(b)
        assert not result.errors and result.rows[0].jump_forward.text == "maybe"
        assert len(s.state.table) == 1
        b.release(4)
        b.release(77)  # unknown: a no-op
        await s.step(b)
        assert len(s.state.table) == 0

    run(main)


def test_batched_fill_equals_the_row_loop(servicer: GrammarServicer, tokenizer: Any) -> None:
    prefixes = ['{"summary": "', '{"summary": "Hi', '{"summary": "Hi.", "grade": "', "{"]

    async def rows(batch_fill_min_rows: int) -> list[pb.MaskRow]:
        servicer.engine.batch_fill_min_rows = batch_fill_min_rows
        s, b = Session(servicer), MaskStepBuilder()
        for h, p in enumerate(prefixes):
            b.bind(h, "regex", PAPER_REGEX, replay=enc(tokenizer, p))
            b.want(h)
        return list((await s.step(b)).rows)

    async def main() -> None:
        saved = servicer.engine.batch_fill_min_rows
        try:
            threaded, looped = await rows(1), await rows(10**6)
        finally:
            servicer.engine.batch_fill_min_rows = saved
        assert threaded == looped
        assert {r.encoding for r in looped} >= {pb.MASK_ENCODING_BITMASK, pb.MASK_ENCODING_ALLOWED}

    run(main)


def test_can_end_and_shortest_forms(servicer: GrammarServicer, tokenizer: Any) -> None:
    schema = '{"type": "object", "properties": {"t": {"type": "string"}}, "required": ["t"]}'

    async def main() -> None:
        s, b = Session(servicer), MaskStepBuilder()
        b.bind(1, "json_schema", schema, replay=enc(tokenizer, '{"t": "'))
        b.bind(2, "regex", "[0-9]+", replay=enc(tokenizer, "7"))
        b.want(1)
        b.want(2)
        inside, digits = (await s.step(b)).rows
        # Inside a free string nearly everything is allowed: the disallowed list is shortest.
        assert inside.encoding == MaskEncoding.DISALLOWED and not inside.can_end
        assert len(inside.data) < 4 * servicer.engine.words
        assert digits.encoding == MaskEncoding.ALLOWED and digits.can_end

    run(main)


def test_malformed_steps_are_rejected(servicer: GrammarServicer) -> None:
    async def main() -> None:
        state = servicer.new_session("bad")
        bad = pb.MaskStep(step_id=1, accept_handles=b"\x01\0\0\0", accept_tokens=b"")
        with pytest.raises(StepFormatError, match="accepts"):
            await servicer.run_step(state, bad)
        with pytest.raises(StepFormatError, match="int32"):
            await servicer.run_step(state, pb.MaskStep(step_id=2, mask_handles=b"\x01"))
        # Found by tests/integration/test_fuzz.py: a negative handle once ended the stream
        # with INTERNAL (its row could not be answered: MaskRow.handle is uint32).
        with pytest.raises(StepFormatError, match="negative handle -3"):
            await servicer.run_step(state, pb.MaskStep(step_id=3, mask_handles=pack_i32([-3])))

    run(main)
