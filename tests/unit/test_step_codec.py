"""The step protocol's codecs, both directions: what the scheduler encodes, the model service
decodes to the same typed ops (and back for results), through real serialized bytes."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh_wire.mask_rows import EncodedRow, MaskEncoding, encode_ids
from radixmesh_wire.pb import grammar_pb2, model_pb2
from radixmesh_wire.step_codec import (
    decode_masks,
    decode_output,
    decode_step,
    decode_worker_info,
    encode_masks,
    encode_output,
    encode_step,
)
from radixmesh_wire.step_ops import (
    AdmitOp,
    ExtendOp,
    KVCopy,
    LateMasks,
    PromptLogprobs,
    RowOutput,
    Sampling,
    StepOps,
    StepOutput,
    WorkerInfo,
)
from scheduler_service.status import Status

VOCAB = 1000
I32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
U32 = st.integers(min_value=0, max_value=2**31 - 1)
ids = st.lists(U32, max_size=20)


def _wire(msg):  # type: ignore[no-untyped-def]
    """Through bytes, as gRPC sends it."""
    return type(msg).FromString(msg.SerializeToString())


def _ops() -> StepOps:
    row = encode_ids([5, 7], VOCAB)
    return StepOps(
        step_id=12,
        admits=[
            AdmitOp(
                handle=3,
                sampling=Sampling(0.5, 0.25, 40, 0.125, 99, True, 5, 2, 3, (2, 7)),
                output_offset=4,
                prefix_slots=[10, 11],
                input_ids=[100, 101, 102],
                slots=[12, 13, 14],
                sample=True,
            )
        ],
        extends=[ExtendOp(1, [7, 8], [20, 21], False)],
        decode_handles=[0, 2],
        decode_slots=[30, 31],
        truncates=[(1, 6)],
        releases=[5, 6],
        freed_slots=[40],
        masks={3: row},
        masks_follow=True,
        copies=[KVCopy(True, [1, 2], [7, 8]), KVCopy(False, [8], [3])],
    )


def test_step_round_trip() -> None:
    ops = _ops()
    assert decode_step(_wire(encode_step(ops))) == ops


@settings(max_examples=50, deadline=None)
@given(handles=ids, slots=ids, releases=ids, freed=ids, ext=ids, follow=st.booleans())
def test_step_lists_round_trip(
    handles: list[int],
    slots: list[int],
    releases: list[int],
    freed: list[int],
    ext: list[int],
    follow: bool,
) -> None:
    ops = StepOps(
        step_id=1,
        extends=[ExtendOp(9, ext, ext[::-1], True)],
        decode_handles=handles,
        decode_slots=slots,
        releases=releases,
        freed_slots=freed,
        masks_follow=follow,
    )
    assert decode_step(_wire(encode_step(ops))) == ops


def test_late_masks_round_trip_and_an_unknown_encoding_is_refused() -> None:
    late = LateMasks(7, {0: encode_ids([1], VOCAB), 4: encode_ids(range(995), VOCAB)}, [2, 3])
    assert late.rows[4].encoding is MaskEncoding.DISALLOWED
    assert decode_masks(_wire(encode_masks(late))) == late
    bad = model_pb2.StepMasks(step_id=1, rows=[grammar_pb2.MaskRow(handle=0, encoding=9)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="handle 0: unknown encoding 9"):
        decode_masks(bad)


def test_output_round_trip_as_columns() -> None:
    out = StepOutput(
        step_id=5,
        rows=[
            RowOutput(3, 11, -0.5, [11, 12], [-0.5, -1.25]),
            RowOutput(1, 22, -2.0),
            RowOutput(0, 33, -0.25, [], []),
        ],
        prompt_logprobs=[PromptLogprobs(1, 4, [-1.5, -3.0]), PromptLogprobs(2, 0, [-0.75])],
        forward_ms=1.5,
    )
    got = decode_output(_wire(encode_output(out)))
    assert (got.step_id, got.forward_ms, got.error) == (5, 1.5, "")
    assert got.handles == [3, 1, 0]
    assert got.tokens == [11, 22, 33]
    assert got.logprobs == [-0.5, -2.0, -0.25]
    assert got.top == {3: ([11, 12], [-0.5, -1.25])}  # an empty top list travels as none
    assert sorted(got.prompt_logprobs, key=lambda p: p.handle) == out.prompt_logprobs


def test_failed_step_and_worker_info() -> None:
    got = decode_output(_wire(model_pb2.StepResult(step_id=2, error="StepError: boom")))
    assert (got.handles, got.tokens, got.error) == ([], [], "StepError: boom")
    info = model_pb2.WorkerInfo(
        model_name="m", kv_capacity=4096, vocab_size=VOCAB, context_length=2048, nan_fill=True
    )
    assert decode_worker_info(_wire(info)) == WorkerInfo("m", 4096, 2048, VOCAB, True)
    info.host_kv_capacity = 1 << 20
    assert decode_worker_info(_wire(info)).host_kv_capacity == 1 << 20


def test_status_numbers_are_grpc_codes() -> None:
    for s in Status:
        assert grpc.StatusCode[s.name].value[0] == int(s)


def test_mask_rows_keep_their_bytes() -> None:
    row = EncodedRow(MaskEncoding.ALLOWED, b"\x05\x00\x00\x00")
    ops = StepOps(step_id=1, decode_handles=[0], decode_slots=[1], masks={0: row})
    msg = _wire(encode_step(ops))
    assert [(m.handle, m.encoding, m.data) for m in msg.masks] == [(0, 2, row.data)]
