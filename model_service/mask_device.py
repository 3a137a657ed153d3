"""Grammar mask rows (`radixmesh_wire.mask_rows`) decoded into torch tensors, on the host or
straight on the sampling device."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from radixmesh_wire.mask_rows import (
    I32,
    EncodedRow,
    MaskEncoding,
    RowLike,
    bitmask_words,
    decode_rows_numpy,
    row_ids,
)


def decode_rows(rows: Sequence[RowLike], vocab_size: int) -> torch.Tensor:
    """Int32 [len(rows), words] CPU tensor for `xgrammar.apply_token_bitmask_inplace`."""
    return torch.from_numpy(decode_rows_numpy(rows, vocab_size))


def decode_row(encoding: int, data: bytes, vocab_size: int) -> torch.Tensor:
    """One row as an int32 [bitmask_words(vocab_size)] CPU tensor."""
    return decode_rows([EncodedRow(MaskEncoding(encoding), data)], vocab_size)[0]


def bitmask_to_bool(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Int32 bitmask words [..., W] -> boolean allowed mask [..., vocab_size] on the same device
    (for samplers that mask logits themselves: `logits.masked_fill_(~allowed, -inf)`)."""
    shifts = torch.arange(32, device=words.device, dtype=torch.int32)
    bits = (words.unsqueeze(-1) >> shifts) & 1  # arithmetic shift is fine: we keep bit 0 only
    return bits.flatten(-2)[..., :vocab_size].bool()


def allowed_on_device(
    rows: Sequence[RowLike], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """Boolean allowed mask [len(rows), vocab_size] built on `device` from the rows' own form.

    Id-list rows are scattered on the device (a few hundred ids each), never expanded into
    full-width bitmasks on the host first: at 64 rows over a 128k vocabulary that host work was
    milliseconds per step, on the critical path between the masks' arrival and sampling. A NONE
    row raises ValueError (never sample it unmasked)."""
    n = len(rows)
    allowed = torch.zeros(n, vocab_size, dtype=torch.bool, device=device)
    bit_rows: list[int] = []
    words: list[np.ndarray] = []
    set_r: list[np.ndarray] = []
    set_i: list[np.ndarray] = []
    clear_rows: list[int] = []
    clear_r: list[np.ndarray] = []
    clear_i: list[np.ndarray] = []
    n_words = bitmask_words(vocab_size)
    for j, row in enumerate(rows):
        enc = MaskEncoding(row.encoding)
        if enc is MaskEncoding.BITMASK:
            w = np.frombuffer(row.data, dtype=I32)
            if w.size != n_words:
                raise ValueError(f"bitmask row has {w.size} words, expected {n_words}")
            bit_rows.append(j)
            words.append(w)
        elif enc is MaskEncoding.ALLOWED:
            ids = row_ids(row.data, vocab_size)
            set_r.append(np.full(ids.size, j, dtype=np.int64))
            set_i.append(ids.astype(np.int64))
        elif enc is MaskEncoding.DISALLOWED:
            ids = row_ids(row.data, vocab_size)
            clear_rows.append(j)
            clear_r.append(np.full(ids.size, j, dtype=np.int64))
            clear_i.append(ids.astype(np.int64))
        else:
            raise ValueError("row has no mask (its grammar failed); do not sample it")

    def dev(a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a))
        if device.type == "cuda":
            return t.pin_memory().to(device, non_blocking=True)
        return t.to(device)

    # Values as device tensors (or index_fill_'s scalar argument): `t[idx] = True` would copy a
    # host scalar to the device synchronously, stalling the host until the queued forward pass
    # is done (measured: +2.4 ms per batch-1 step).
    if bit_rows:
        allowed.index_copy_(
            0,
            dev(np.asarray(bit_rows, dtype=np.int64)),
            bitmask_to_bool(dev(np.stack(words)), vocab_size),
        )
    if set_r:
        true = torch.ones((), dtype=torch.bool, device=device)
        allowed.index_put_((dev(np.concatenate(set_r)), dev(np.concatenate(set_i))), true)
    if clear_rows:
        allowed.index_fill_(0, dev(np.asarray(clear_rows, dtype=np.int64)), True)
        false = torch.zeros((), dtype=torch.bool, device=device)
        allowed.index_put_((dev(np.concatenate(clear_r)), dev(np.concatenate(clear_i))), false)
    return allowed
