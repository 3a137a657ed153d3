"""The worker's step check has a whole-set path for decode rows (issue 27: at 256 rows the
row-by-row check cost ~160 us per step on the step thread). It must refuse exactly what the
row-by-row checks refuse, with the same message: random steps, valid and broken in every way
the checks know, give the same outcome with the fast path and with it switched off."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import model_service.step_validation as sv
from model_service.runner import RequestState, StepError
from model_service.slot_seq import SlotSeq
from model_service.step_validation import StepLimits, validate_step
from radixmesh_wire.step_ops import AdmitOp, ExtendOp, Sampling, StepOps

LIM = StepLimits(vocab_size=100, kv_capacity=64, context_length=16, max_handles=8)


def _outcome(ops: StepOps, reqs: dict[int, RequestState]) -> str:
    try:
        validate_step(ops, reqs, LIM)
    except StepError as exc:
        return str(exc)
    return "ok"


def _rarely(one: st.SearchStrategy) -> st.SearchStrategy:  # type: ignore[type-arg]
    """Mostly no item, else one: each kind of row or edit breaks a step in its own ways."""
    return st.one_of(st.just([]), st.just([]), st.just([]), st.lists(one, min_size=1, max_size=1))


@st.composite
def cases(draw: st.DrawFn) -> tuple[StepOps, dict[int, RequestState]]:
    handles = st.integers(0, 9)
    reqs = {
        h: RequestState(
            Sampling(),
            SlotSeq(list(range(draw(st.integers(0, 16))))),
            sampled=1,
            has_token=draw(st.integers(0, 5)) > 0,
        )
        for h in draw(st.sets(st.integers(0, 7), max_size=6))
    }
    if reqs:  # mostly live handles, so that most steps get as far as their decode rows
        known = st.sampled_from(sorted(reqs))
        handles = st.one_of(known, known, known, handles)
    slot = st.one_of(st.integers(0, 63), st.integers(0, 63), st.integers(-1, 66))
    n_dec = draw(st.integers(0, 8))
    ops = StepOps(
        step_id=1,
        decode_handles=draw(st.lists(handles, min_size=n_dec, max_size=n_dec)),
        decode_slots=draw(st.lists(slot, min_size=n_dec, max_size=n_dec + draw(st.integers(0, 1)))),
        releases=draw(st.lists(st.integers(0, 8), max_size=1)),
        truncates=draw(_rarely(st.tuples(handles, st.integers(0, 17)))),
    )
    for h in draw(_rarely(handles)):
        n = draw(st.integers(1, 12))
        ops.extends.append(ExtendOp(h, [7] * n, draw(st.lists(slot, min_size=n, max_size=n)), True))
    for h in draw(_rarely(st.integers(0, 9))):
        ids = draw(st.lists(st.integers(-1, 101), min_size=1, max_size=4))
        ops.admits.append(AdmitOp(h, Sampling(), 0, [], ids, list(range(40, 40 + len(ids))), True))
    return ops, reqs


@settings(max_examples=200, deadline=None)
@given(cases())
def test_fast_path_refuses_exactly_what_the_row_checks_refuse(
    case: tuple[StepOps, dict[int, RequestState]],
) -> None:
    ops, reqs = case
    fast = _outcome(ops, reqs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sv, "_decodes_ok", lambda *a: False)  # row by row, as before
        slow = _outcome(ops, reqs)
    assert fast == slow


def test_a_decode_only_step_never_looks_row_by_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """256 valid decode rows: the per-row helper (`row`, through `_in_range`) is not called,
    and no length is computed for a request that only decodes."""
    reqs = {
        h: RequestState(Sampling(), SlotSeq(list(range(5))), sampled=1, has_token=True)
        for h in range(256)
    }
    lim = StepLimits(vocab_size=100, kv_capacity=4096, context_length=64, max_handles=512)
    ops = StepOps(step_id=1, decode_handles=list(range(256)), decode_slots=list(range(256)))
    calls: list[str] = []
    real = sv._in_range

    def counted(what: str, values: list[int], hi: int) -> None:
        calls.append(what)
        real(what, values, hi)

    monkeypatch.setattr(sv, "_in_range", counted)
    validate_step(ops, reqs, lim)
    # the step's own lists only (releases, freed slots); before: one more per decode row
    assert calls == ["released handle", "freed slot"]
