"""The model worker's own step checks: out-of-range ids, slots and handles, unknown or
duplicate handles and bad sampling values are refused before any state changes."""

from __future__ import annotations

import math
import re

import pytest
import torch

from model_service.kv_pool import KVPool
from model_service.runner import RequestState, StepError
from model_service.slot_seq import SlotSeq
from model_service.step_validation import StepLimits, validate_step
from radixmesh_wire.step_ops import AdmitOp, ExtendOp, KVCopy, Sampling, StepOps

LIM = StepLimits(vocab_size=100, kv_capacity=64, context_length=16, max_handles=8)


def _state(n: int, has_token: bool = True) -> RequestState:
    return RequestState(Sampling(), SlotSeq(list(range(n))), sampled=1, has_token=has_token)


def _admit(handle: int = 3, ids: list[int] | None = None, **sampling: object) -> AdmitOp:
    ids = [1, 2] if ids is None else ids
    return AdmitOp(
        handle=handle,
        sampling=Sampling(**sampling),  # type: ignore[arg-type]
        output_offset=0,
        prefix_slots=[],
        input_ids=ids,
        slots=list(range(20, 20 + len(ids))),
        sample=True,
    )


def test_valid_step_passes() -> None:
    reqs = {0: _state(4), 1: _state(15)}
    ops = StepOps(
        step_id=1,
        admits=[_admit(3, top_logprobs=5, stop_ids=(99,))],
        extends=[ExtendOp(0, [5, 6], [30, 31], True)],
        decode_handles=[1],
        decode_slots=[40],
        releases=[1, 7],
    )
    with pytest.raises(StepError, match="decode of unknown handle 1"):
        validate_step(ops, reqs, LIM)  # 1 is released before it decodes
    ops.releases = [7]
    validate_step(ops, reqs, LIM)
    assert len(reqs[0].slots) == 4 and 3 not in reqs  # nothing changed


def _bad(ops: StepOps, needle: str, reqs: dict[int, RequestState] | None = None) -> None:
    with pytest.raises(StepError, match=needle):
        validate_step(ops, reqs if reqs is not None else {0: _state(4)}, LIM)


def test_refusals() -> None:
    _bad(StepOps(1, admits=[_admit(ids=[1, 1_000_000])]), "token id 1000000")
    _bad(StepOps(1, admits=[_admit(handle=10_000_000)]), "admitted handle 10000000")
    _bad(StepOps(1, admits=[_admit(handle=0)]), "admitted twice")
    _bad(StepOps(1, admits=[_admit(), _admit()]), "admitted twice|two rows")
    _bad(StepOps(1, admits=[_admit(ids=[])]), "0 ids for 0 slots")
    _bad(StepOps(1, admits=[_admit(temperature=math.inf)]), "temperature")
    _bad(StepOps(1, admits=[_admit(top_p=math.nan)]), "top_p")
    _bad(StepOps(1, admits=[_admit(stop_ids=(100,), min_new_tokens=3)]), "stop id 100")
    _bad(StepOps(1, admits=[_admit(top_logprobs=101)]), "top_logprobs")
    _bad(StepOps(1, admits=[_admit(ids=list(range(17)))]), "exceed the context length")
    _bad(StepOps(1, extends=[ExtendOp(5, [1], [1], True)]), "extend of unknown handle 5")
    _bad(StepOps(1, extends=[ExtendOp(0, [1], [64], True)]), "slot 64")
    _bad(StepOps(1, extends=[ExtendOp(0, [1, 2], [1], True)]), "2 ids for 1 slots")
    _bad(StepOps(1, decode_handles=[0], decode_slots=[]), "1 decode handles for 0 slots")
    _bad(StepOps(1, decode_handles=[0], decode_slots=[1], truncates=[(0, 2)]), "no sampled")
    _bad(StepOps(1, decode_handles=[0], decode_slots=[1]), "no sampled", {0: _state(4, False)})
    _bad(StepOps(1, decode_handles=[0, 0], decode_slots=[1, 2]), "two rows")
    _bad(StepOps(1, truncates=[(0, 9)]), "truncate to 9 of a 4-token")
    _bad(StepOps(1, releases=[-1]), "released handle -1")
    _bad(StepOps(1, freed_slots=[99]), "freed slot 99")


@pytest.mark.parametrize(
    ("copy", "lim_host", "needle"),
    [
        (KVCopy(True, [1], [2]), 0, "no host KV pool"),
        (KVCopy(True, [1, 2], [3]), 32, "2 source slots for 1 destinations"),
        (KVCopy(True, [64], [3]), 32, "slot 64 is outside [0, 64)"),
        (KVCopy(True, [1], [32]), 32, "host slot 32 is outside [0, 32)"),
        (KVCopy(False, [40], [1]), 32, "host slot 40 is outside [0, 32)"),
        (KVCopy(False, [1, 2], [5, 5]), 32, "a destination slot appears twice"),
    ],
)
def test_host_tier_copies_are_checked(copy: KVCopy, lim_host: int, needle: str) -> None:
    lim = StepLimits(
        vocab_size=100, kv_capacity=64, context_length=16, max_handles=8, host_kv_capacity=lim_host
    )
    with pytest.raises(StepError, match=re.escape(needle)):
        validate_step(StepOps(step_id=1, copies=[copy]), {}, lim)
    ok = StepOps(step_id=1, copies=[KVCopy(True, [0, 63], [31, 0]), KVCopy(False, [31], [7])])
    validate_step(ok, {}, StepLimits(100, 64, 16, 8, host_kv_capacity=32))


def test_kv_pool_copies_round_trip_on_cpu() -> None:
    pool = KVPool(2, 8, 1, 2, torch.float32, "cpu")
    pool.add_host_tier(4)
    pool.k[:, 3] = 3.0
    pool.v[:, 3] = -3.0
    pool.k[:, 5] = 5.0
    pool.copy(True, [3, 5], [1, 0])  # save
    pool.k.zero_()
    pool.v.zero_()
    pool.copy(False, [0, 1], [6, 2])  # load back elsewhere
    assert pool.k[:, 6].eq(5.0).all() and pool.k[:, 2].eq(3.0).all()
    assert pool.v[:, 2].eq(-3.0).all() and pool.k[:, 3].eq(0.0).all()
