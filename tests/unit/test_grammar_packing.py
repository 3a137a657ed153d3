"""Mask row encoding: round trips for all three forms, choice of the shortest, the many-row fast
path, and compatibility with xgrammar's own bitmask application."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xgrammar as xgr

from grammar_service.matchers import ErrorCode
from model_service.mask_device import allowed_on_device, bitmask_to_bool, decode_row, decode_rows
from radixmesh_wire.mask_rows import (
    EncodedRow,
    MaskEncoding,
    bitmask_words,
    choose_encoding,
    encode_ids,
    encode_rows,
)
from radixmesh_wire.pb import grammar_pb2 as pb


def _bitmask(allowed: list[np.ndarray], vocab: int) -> np.ndarray:
    bits = np.zeros((len(allowed), bitmask_words(vocab) * 32), dtype=bool)
    for i, ids in enumerate(allowed):
        bits[i, ids] = True
    return np.packbits(bits, axis=1, bitorder="little").view("<i4")


def _allowed(words: torch.Tensor | np.ndarray, vocab: int) -> np.ndarray:
    arr = np.asarray(words, dtype="<i4")
    return np.flatnonzero(np.unpackbits(arr.view(np.uint8), bitorder="little", count=vocab))


@pytest.mark.parametrize("vocab", [49152, 1000, 1001])
def test_round_trip_all_forms(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    few = np.sort(rng.choice(vocab, 3, replace=False))  # -> ALLOWED
    most = np.setdiff1d(np.arange(vocab), few)  # -> DISALLOWED
    half = np.sort(rng.choice(vocab, vocab // 2, replace=False))  # -> BITMASK
    rows = encode_rows(_bitmask([few, most, half, np.array([], int)], vocab), vocab)
    assert [r.encoding for r in rows] == [
        MaskEncoding.ALLOWED,
        MaskEncoding.DISALLOWED,
        MaskEncoding.BITMASK,
        MaskEncoding.ALLOWED,
    ]
    assert np.frombuffer(rows[0].data, "<i4").tolist() == few.tolist()
    assert np.frombuffer(rows[1].data, "<i4").tolist() == few.tolist()  # the complement
    assert len(rows[2].data) == 4 * bitmask_words(vocab)
    assert rows[3].data == b""  # nothing allowed: empty ALLOWED list
    for row, ids in zip(rows, [few, most, half, np.array([], int)], strict=True):
        assert _allowed(decode_row(row.encoding, row.data, vocab), vocab).tolist() == ids.tolist()
    batch = decode_rows(rows, vocab)
    assert batch.dtype == torch.int32 and batch.shape == (4, bitmask_words(vocab))
    for i, ids in enumerate([few, most, half]):
        assert _allowed(batch[i], vocab).tolist() == ids.tolist()


@pytest.mark.parametrize("vocab", [128256, 1001])
def test_allowed_on_device_equals_the_decoded_bitmask(vocab: int) -> None:
    """The model's path (id lists scattered on the device) gives exactly the bitmask view."""
    rng = np.random.default_rng(vocab + 1)
    few = np.sort(rng.choice(vocab, 5, replace=False))
    most = np.setdiff1d(np.arange(vocab), few)
    half = np.sort(rng.choice(vocab, vocab // 2, replace=False))
    sets = [half, few, most, np.array([], int), few[:1]]
    rows = encode_rows(_bitmask(sets, vocab), vocab)
    assert {r.encoding for r in rows} == {
        MaskEncoding.BITMASK,
        MaskEncoding.ALLOWED,
        MaskEncoding.DISALLOWED,
    }
    got = allowed_on_device(rows, vocab, torch.device("cpu"))
    assert torch.equal(got, bitmask_to_bool(decode_rows(rows, vocab), vocab))
    for i, ids in enumerate(sets):
        assert torch.nonzero(got[i]).flatten().tolist() == ids.tolist()
    with pytest.raises(ValueError):
        allowed_on_device([EncodedRow(MaskEncoding.NONE, b"")], vocab, torch.device("cpu"))


def test_shortest_form_is_chosen_with_ties_to_bitmask() -> None:
    vocab = 3200  # 100 words = 400 bytes: lists of 100 ids tie with the bitmask
    assert choose_encoding(99, vocab) is MaskEncoding.ALLOWED
    assert choose_encoding(100, vocab) is MaskEncoding.BITMASK
    assert choose_encoding(101, vocab) is MaskEncoding.BITMASK
    assert choose_encoding(vocab - 100, vocab) is MaskEncoding.BITMASK
    assert choose_encoding(vocab - 99, vocab) is MaskEncoding.DISALLOWED
    rng = np.random.default_rng(0)
    for n in rng.integers(0, vocab + 1, 50):
        ids = np.sort(rng.choice(vocab, int(n), replace=False))
        (row,) = encode_rows(_bitmask([ids], vocab), vocab)
        assert len(row.data) == min(400, 4 * int(n), 4 * (vocab - int(n)))


def test_padding_bits_are_ignored_and_cleared() -> None:
    vocab = 40  # 2 words, 24 padding bits
    words = _bitmask([np.arange(20)], vocab)
    words[0, 1] |= np.int32(-(1 << 8))  # garbage in bits 40..63
    (row,) = encode_rows(words, vocab)
    assert row.encoding is MaskEncoding.BITMASK  # 20 ids = 80 bytes > 8 bytes of bitmask
    assert _allowed(decode_row(row.encoding, row.data, vocab), vocab).tolist() == list(range(20))
    (dis,) = encode_rows(_bitmask([np.arange(39)], vocab), vocab)
    assert dis.encoding is MaskEncoding.DISALLOWED and np.frombuffer(dis.data, "<i4")[0] == 39
    decoded = decode_row(dis.encoding, dis.data, vocab).numpy().view(np.uint32)
    assert decoded[1] == (1 << 7) - 1  # ids 32..38 set, id 39 and the padding clear


def test_encode_ids_and_bool_view() -> None:
    vocab = 49152
    row = encode_ids([2, 0], vocab)
    assert row == EncodedRow(MaskEncoding.ALLOWED, np.array([0, 2], "<i4").tobytes())
    words = decode_rows([row, row], vocab)
    allowed = bitmask_to_bool(words, vocab)
    assert allowed.shape == (2, vocab) and allowed.dtype == torch.bool
    assert torch.nonzero(allowed[1]).flatten().tolist() == [0, 2]
    # bit 31 (the sign bit of an int32 word) must survive the shift trick
    top = decode_row(MaskEncoding.ALLOWED, np.array([31, 63], "<i4").tobytes(), vocab)
    assert torch.nonzero(bitmask_to_bool(top, vocab)).flatten().tolist() == [31, 63]


def test_decoded_rows_work_with_xgrammar_apply() -> None:
    vocab = 1000
    rng = np.random.default_rng(1)
    sets = [np.sort(rng.choice(vocab, k, replace=False)) for k in (5, 500, 990)]
    rows = encode_rows(_bitmask(sets, vocab), vocab)
    logits = torch.zeros(3, vocab)
    xgr.apply_token_bitmask_inplace(logits, decode_rows(rows, vocab))
    for i, ids in enumerate(sets):
        assert torch.isfinite(logits[i]).nonzero().flatten().tolist() == ids.tolist()


def test_none_rows_and_bad_rows_raise() -> None:
    with pytest.raises(ValueError, match="no mask"):
        decode_rows([EncodedRow(MaskEncoding.NONE, b"")], 64)
    with pytest.raises(ValueError, match="words"):
        decode_row(MaskEncoding.BITMASK, b"\0" * 4, 64)
    with pytest.raises(ValueError, match="outside"):
        decode_row(MaskEncoding.ALLOWED, np.array([64], "<i4").tobytes(), 64)


def test_proto_rows_decode_and_enums_match_the_proto() -> None:
    for enc in MaskEncoding:
        assert pb.MaskEncoding.Value(f"MASK_ENCODING_{enc.name}") == enc.value
    for code in ErrorCode:
        assert pb.GrammarErrorCode.Value(f"GRAMMAR_ERROR_{code.name}") == code.value
    data = np.array([7], "<i4").tobytes()
    row = pb.MaskRow(handle=1, encoding=pb.MASK_ENCODING_ALLOWED, data=data)
    assert _allowed(decode_rows([row], 64)[0], 64).tolist() == [7]
