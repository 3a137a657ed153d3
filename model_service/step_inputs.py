"""A step's inputs on the device, in one staged copy (`transfer.HostStager`).

The runner lays a step's rows out on the host (`runner._lay_out` fills a `StepLayout`:
positions, output slots, the rows' KV slot lists, logit rows); this sends what the forward pass
reads of it, and the token ids, together. Decode rows' input tokens never come from the host:
they are gathered from `last_tokens` on the device (the previous step's tokens may not have
reached the host yet).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from model_service.image_rows import RowSpan
from model_service.runner_state import StepRow
from model_service.transfer import Concat, HostStager


@dataclass
class StepLayout:
    """Where a step's rows go in its flat batch (built by `runner._lay_out`, which owns the
    request state it walks)."""

    pos: list[int]  # absolute position of every token
    out_slots: list[int]  # the KV slot every token writes
    kv_views: list[np.ndarray]  # per row: all its KV slots
    kv_lens: list[int]
    logit_rows: list[int]  # token rows that get logits
    lp_spans: list[tuple[int, int, int] | None]  # per row, for prompt logprobs
    sample_rows: list[int]  # the logit row of each sampled row
    image_spans: list[RowSpan]
    tokens: int  # the step's tokens (the cursor after the last row)


@dataclass(frozen=True)
class StepInputs:
    """A step's inputs on the device (views of one staged copy: valid for this step only)."""

    ids: torch.Tensor
    kv_flat: torch.Tensor
    out_slots: torch.Tensor
    pos: torch.Tensor
    logit_rows: torch.Tensor


def stage_inputs(
    stager: HostStager,
    last_tokens: torch.Tensor,
    rows: list[StepRow],
    lay: StepLayout,
) -> StepInputs:
    """The step's inputs on the device in one staged copy. Decode inputs are gathered from
    `last_tokens` on the device (they may not have reached the host yet)."""
    host: list[int] = []
    dec_at: list[int] = []
    dec_handles: list[int] = []
    for r in rows:
        if r.input_ids is None:
            dec_at.append(len(host))
            dec_handles.append(r.handle)
            host.append(0)
        else:
            host.extend(r.input_ids)
    i64 = torch.int64
    ids, dh, da, kv_flat, out_slots, pos, logit_rows = stager.send(
        [
            (host, i64),
            (dec_handles, i64),
            (dec_at, i64),
            (Concat(lay.kv_views), i64),  # every row's KV slots, split per row below
            (lay.out_slots, i64),
            (lay.pos, i64),
            (lay.logit_rows, i64),
        ]
    )
    if dec_at:
        src = last_tokens.index_select(0, dh)
        if len(dec_at) == lay.tokens:
            ids = src
        else:
            ids.index_copy_(0, da, src)
    return StepInputs(ids, kv_flat, out_slots, pos, logit_rows)
