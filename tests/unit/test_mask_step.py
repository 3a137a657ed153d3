"""Typed mask steps: the scheduler's GrammarOps plans one, `encode_mask_step` puts it on the
wire exactly as the MaskStepBuilder does, and a MaskStepResult decodes to typed rows."""

from __future__ import annotations

import pytest

from radixmesh_wire.mask_rows import EncodedRow, MaskEncoding, encode_ids
from radixmesh_wire.mask_step import (
    ERROR_COMPILE,
    Bind,
    MaskStepBuilder,
    MaskStepPlan,
    RowFailure,
    decode_mask_result,
    encode_mask_step,
)
from radixmesh_wire.packing import pack_i32, unpack_i32
from radixmesh_wire.pb import grammar_pb2 as pb
from scheduler_service.grammar.ops import GrammarOps


def test_grammar_ops_plan_and_its_encoding() -> None:
    g = GrammarOps()
    g.bind(1, "regex", "a+", [5])
    g.accept(2, 7)
    g.accept(3, 8)
    g.accept(3, 9)
    g.rollback(4, 2)
    g.rollback(6, 0)
    g.bind(5, "ebnf", "root ::= x")
    g.release(5)  # bound and released before any step: forgotten
    g.release(8)  # bound by an earlier step: the service is told
    plan = g.build(11, want=[2, 3], jump=[3])
    assert plan == MaskStepPlan(
        11,
        releases=[8],
        binds=[Bind(1, "regex", "a+", [5])],
        rollbacks=[(4, 2)],
        accepts={2: [7], 3: [8, 9]},
        want=[2, 3],
        jump=[3],
    )
    assert not g  # collected operations go with one step only
    assert g.build(12, want=[]) == MaskStepPlan(12)

    msg = pb.MaskStep.FromString(encode_mask_step(plan).SerializeToString())
    assert unpack_i32(msg.release_handles) == [8]
    assert [(b.handle, b.grammar.kind, b.grammar.text) for b in msg.binds] == [
        (1, pb.GRAMMAR_KIND_REGEX, "a+")
    ]
    assert unpack_i32(msg.binds[0].replay_tokens) == [5]
    assert [(r.handle, r.num_tokens) for r in msg.rollbacks] == [(4, 2)]
    assert unpack_i32(msg.accept_handles) == [2, 3]
    assert unpack_i32(msg.accept_counts) == [1, 2]
    assert unpack_i32(msg.accept_tokens) == [7, 8, 9]
    assert unpack_i32(msg.mask_handles) == [2, 3]
    assert unpack_i32(msg.jump_forward_handles) == [3]

    b = MaskStepBuilder()  # the builder for tests and benchmarks says the same
    b.release(8)
    b.bind(1, "regex", "a+", [5])
    b.rollback(4, 2)
    b.accept(2, [7])
    b.accept(3, [8, 9])
    b.want(2)
    b.want(3, jump_forward=True)
    assert b.build(11) == encode_mask_step(plan)
    assert not b


def test_one_token_each_travels_without_counts() -> None:
    msg = encode_mask_step(MaskStepPlan(1, accepts={0: [4], 1: [5]}, want=[0, 1]))
    assert msg.accept_counts == b""


def test_unknown_grammar_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown grammar kind 'yaml'"):
        MaskStepBuilder().bind(0, "yaml", "x")


def test_result_decodes_to_typed_rows() -> None:
    row = encode_ids([3], 100)
    res = pb.MaskStepResult(
        step_id=4,
        rows=[
            pb.MaskRow(handle=1, encoding=row.encoding, data=row.data),  # type: ignore[arg-type]
            pb.MaskRow(
                handle=2,
                encoding=pb.MASK_ENCODING_ALLOWED,
                data=pack_i32([5]),
                jump_forward=pb.JumpForward(text='"}', rollback=1, tokens=pack_i32([8, 9])),
            ),
        ],
        errors=[pb.RowError(handle=6, code=pb.GRAMMAR_ERROR_COMPILE, message="bad")],
    )
    out = decode_mask_result(pb.MaskStepResult.FromString(res.SerializeToString()))
    assert out.step_id == 4
    assert out.rows == {1: row, 2: EncodedRow(MaskEncoding.ALLOWED, pack_i32([5]))}
    assert list(out.rows) == [1, 2]  # the order asked for
    assert out.jumps == {2: (1, [8, 9])}
    assert out.errors == [RowFailure(6, ERROR_COMPILE, "bad")]
    # A step that asked for no jump-forward does not read them.
    assert decode_mask_result(res, jumps_asked=False).jumps == {}
    bad = pb.MaskStepResult(rows=[pb.MaskRow(handle=3, encoding=7)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="handle 3: unknown encoding 7"):
        decode_mask_result(bad)


def test_error_compile_is_the_proto_number() -> None:
    assert ERROR_COMPILE == pb.GRAMMAR_ERROR_COMPILE
