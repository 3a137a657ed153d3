"""Load-ahead on the model service (issue 31): a step's host -> GPU loads run beside its
forward pass, the next step waits for them; a step whose rows touch a slot its own loads
write (what a scheduler without load-ahead sends) waits for them first, as before; and the
copy counters (copies, tokens, bytes per direction).

The runner test uses a copy lane that runs queued copy work only when the compute stream
waits for it (or the CPU does): a load the runner waits for too early or too late shows up as
KV that differs from the plain synchronous reference."""

from __future__ import annotations

import pytest
import torch

from model_service.attention.reference import ReferenceAttention
from model_service.copy_stats import CopyStats
from model_service.kv_copy import Event, StagedCopier
from model_service.kv_pool import KVPool
from model_service.metrics import ModelMetrics
from model_service.runner import ModelRunner
from model_service.runner_state import RequestState
from model_service.slot_seq import SlotSeq
from model_service.step_validation import StepLimits, rows_touching_loads, validate_step
from model_service.weights import random_model
from radixmesh_wire.step_ops import AdmitOp, ExtendOp, KVCopy, Sampling, StepOps, StepOutput
from tests.tiny_runner import DeferredLane, tiny_llama_args

VOCAB, LAYERS, HEADS, DIM = 300, 2, 2, 32
GREEDY = Sampling(temperature=0.0)
# On a GPU machine the runner test also runs on CUDA: real copy stream and events.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class WaitLane(DeferredLane):
    """A deferred copy stream (tests/tiny_runner.py) whose compute-stream waits run at once:
    the runner test has no "main" of its own to call."""

    def release_main(self, ev: Event | None) -> None:
        super().release_main(ev)
        self.main()


def _runner(lane: WaitLane | None, device: str = "cpu", staged: bool = True) -> ModelRunner:
    """The staged copy path (CUDA: on a copy stream; CPU: synchronous, or on ``lane``), or
    with ``staged=False`` the plain reference copy, done before the step goes on."""
    args = tiny_llama_args(VOCAB)
    dev = torch.device(device)
    model = random_model(args, torch.float32, dev, seed=7)
    pool = KVPool(LAYERS, 64, HEADS, DIM, torch.float32, dev)
    pool.add_host_tier(32, staged=staged)
    if lane is not None:
        assert pool.host is not None
        pool.copier = StagedCopier(pool.k, pool.v, pool.host, lane=lane)
    return ModelRunner(model, pool, ReferenceAttention(pool, 4, DIM), dev)


PROMPT = [11, 12, 13, 14, 15, 16]
OTHER = [21, 22, 23]


def _steps() -> list[StepOps]:
    """1: compute PROMPT's KV (slots 0-5); 2: save it to host 10-15 and release the request;
    3: load host 10-14 into GPU 20-24 while another request prefills (slots 30-32); 4: a
    request with the loaded prefix (PROMPT[:5]) prefills its last token (slot 40)."""
    return [
        StepOps(1, admits=[AdmitOp(0, GREEDY, 0, [], PROMPT, list(range(6)), True)]),
        StepOps(2, releases=[0], copies=[KVCopy(True, list(range(6)), list(range(10, 16)))]),
        StepOps(
            3,
            admits=[AdmitOp(1, GREEDY, 0, [], OTHER, [30, 31, 32], True)],
            copies=[KVCopy(False, list(range(10, 15)), list(range(20, 25)))],
        ),
        StepOps(4, admits=[AdmitOp(2, GREEDY, 0, list(range(20, 25)), [99], [40], True)]),
    ]


def _rows(out: StepOutput) -> dict[int, tuple[int, float]]:
    return {r.handle: (r.token, r.logprob) for r in out.rows}


@pytest.mark.parametrize("device", DEVICES)
def test_load_ahead_gives_the_tokens_of_synchronous_copies(device: str) -> None:
    """The staged path (CUDA: a copy stream, the load waited for at the next step) gives the
    tokens and logprobs of the reference copy, which is done before the step goes on."""
    ref = _runner(None, device, staged=False)
    expected = [_rows(ref.step(s)) for s in _steps()]
    r = _runner(None, device)
    steps = _steps()
    got = [_rows(r.step(s)) for s in steps[:3]]
    cuda = device == "cuda"
    assert r.pool.loads_pending == (1 if cuda else 0)  # CPU: nothing is ever pending
    got.append(_rows(r.step(steps[3])))
    assert r.pool.loads_pending == 0
    assert got == expected
    c = r.pool.copy_stats
    c.poll()
    assert (c.save.tokens, c.load.tokens, c.load.copies) == (6, 5, 1)


def test_a_load_overlaps_its_own_step_and_the_next_step_waits_for_it() -> None:
    ref = _runner(None, staged=False)  # reference: every copy done when it returns
    expected = [_rows(ref.step(s)) for s in _steps()]
    lane = WaitLane()
    r = _runner(lane)
    steps = _steps()
    got = [_rows(r.step(s)) for s in steps[:3]]
    # Step 3 carried the load: its forward pass did not wait for it, so the loaded GPU slots
    # are still untouched (zeros) while its other row was computed.
    assert r.pool.loads_pending == 1
    assert not r.pool.k[:, 20:25].any()
    load_end = len(lane.queue)
    assert max(lane.waits, default=0) < load_end
    got.append(_rows(r.step(steps[3])))  # step 4 waits for it first, then reads the prefix
    assert lane.waits[-1] == load_end and r.pool.loads_pending == 0
    assert got == expected
    assert torch.equal(r.pool.k[:, 20:25], ref.pool.k[:, 20:25])


def _state(slots: list[int]) -> RequestState:
    st = RequestState(GREEDY, SlotSeq(slots), 0)
    st.has_token = True
    return st


LIM = StepLimits(vocab_size=VOCAB, kv_capacity=64, context_length=64, max_handles=16,
                 host_kv_capacity=32)  # fmt: skip
LOAD = KVCopy(False, [1, 2], [20, 21])


@pytest.mark.parametrize(
    "ops",
    [
        StepOps(1, admits=[AdmitOp(3, GREEDY, 0, [20, 21], [5], [22], True)], copies=[LOAD]),
        StepOps(1, admits=[AdmitOp(3, GREEDY, 0, [], [5, 6], [22, 21], True)], copies=[LOAD]),
        StepOps(1, extends=[ExtendOp(0, [5], [21], True)], copies=[LOAD]),
        StepOps(1, decode_handles=[1], decode_slots=[20], copies=[LOAD]),
        StepOps(1, decode_handles=[0, 2], decode_slots=[30, 31], copies=[LOAD]),
    ],
    ids=["admit-prefix", "admit-writes", "extend-writes", "decode-writes", "decode-reads"],
)
def test_a_row_touching_a_slot_loaded_in_the_same_step_is_found(ops: StepOps) -> None:
    requests = {0: _state([3, 4]), 1: _state([5]), 2: _state([6, 21, 7])}
    validate_step(ops, requests, LIM)  # a valid step: it runs, waiting for its loads
    found = rows_touching_loads(ops, requests, LIM.kv_capacity)
    assert found is not None and found.split(", ")[1] in ("GPU slot 20", "GPU slot 21")


def test_rows_beside_a_load_and_the_next_steps_reader_are_accepted() -> None:
    requests = {0: _state([3, 4]), 1: _state([5])}
    beside = StepOps(
        1,
        admits=[AdmitOp(3, GREEDY, 0, [3, 4], [5], [22], True)],
        extends=[ExtendOp(0, [5], [23], True)],
        decode_handles=[1],
        decode_slots=[24],
        copies=[LOAD, KVCopy(True, [25], [9])],
    )
    assert rows_touching_loads(beside, requests, LIM.kv_capacity) is None
    after = StepOps(2, admits=[AdmitOp(4, GREEDY, 0, [20, 21], [5], [26], True)])
    assert rows_touching_loads(after, requests, LIM.kv_capacity) is None  # no loads in it
    # A slot cut off by a truncate of the same step is no longer read.
    cut = StepOps(3, truncates=[(2, 1)], extends=[ExtendOp(2, [5], [27], True)], copies=[LOAD])
    assert rows_touching_loads(cut, {**requests, 2: _state([6, 21])}, LIM.kv_capacity) is None


def test_a_step_reading_its_own_load_waits_for_it_first() -> None:
    """A scheduler without load-ahead loads a prefix and prefills on it in one step: the
    runner then makes that step's forward pass wait for the load (tokens as the reference)."""
    ref = _runner(None, staged=False)
    steps = _steps()
    same_step = [*steps[:2], StepOps(3, admits=steps[3].admits, copies=steps[2].copies)]
    expected = [_rows(ref.step(s)) for s in same_step]
    lane = WaitLane()
    r = _runner(lane)
    got = [_rows(r.step(s)) for s in same_step]
    assert r.pool.loads_pending == 0  # waited for in its own step
    assert lane.waits and lane.waits[-1] == len(lane.queue)
    assert r.pool.copy_stats.same_step_waits == 1
    assert got == expected


def test_copy_counters_are_exact_per_direction() -> None:
    pool = KVPool(LAYERS, 64, HEADS, DIM, torch.float32, "cpu")
    pool.add_host_tier(32)
    token_bytes = 2 * LAYERS * HEADS * DIM * 4
    pool.copy(True, [0, 1, 2, 3, 4], [10, 11, 12, 13, 14])
    pool.copy(True, [7], [3])
    pool.copy(False, [10, 11, 12], [40, 41, 42], ahead=True)
    st = pool.copy_stats
    assert (st.save.copies, st.save.tokens, st.save.bytes) == (2, 6, 6 * token_bytes)
    assert (st.load.copies, st.load.tokens, st.load.bytes) == (1, 3, 3 * token_bytes)
    assert st.save.seconds > 0 and st.load.seconds > 0 and st.in_flight == 0
    assert pool.loads_pending == 0  # on CPU a load is done when copy returns
    metrics = ModelMetrics(64, copies=st)
    reg = metrics.registry
    for d, t in (("save", st.save), ("load", st.load)):
        lab = {"direction": d}
        assert reg.get_sample_value("radixmesh_kv_copies_total", lab) == t.copies
        assert reg.get_sample_value("radixmesh_kv_copy_tokens_total", lab) == t.tokens
        assert reg.get_sample_value("radixmesh_kv_copy_bytes_total", lab) == t.bytes


class FakeTimer:
    """A timing event: done once the test says so, 2 ms after its partner start event."""

    def __init__(self, at_ms: float) -> None:
        self.at_ms, self.ready = at_ms, False

    def query(self) -> bool:
        return self.ready

    def elapsed_time(self, end: FakeTimer) -> float:
        return end.at_ms - self.at_ms


def test_copy_time_on_the_copy_stream_is_read_only_once_it_completed() -> None:
    st = CopyStats()
    a0, a1, b0, b1 = FakeTimer(0), FakeTimer(2), FakeTimer(2), FakeTimer(5)
    st.add(False, 4, 400, events=(a0, a1))
    st.add(True, 2, 200, events=(b0, b1))
    assert st.load.tokens == 4 and st.save.bytes == 200  # counted at once
    assert st.load.seconds == 0 and st.in_flight == 2  # time: not done, nothing waited
    b1.ready = True  # a later copy done but not the first: the stream runs them in order
    st.poll()
    assert st.in_flight == 2
    a1.ready = True
    st.poll()
    assert st.in_flight == 0
    assert st.load.seconds == pytest.approx(0.002) and st.save.seconds == pytest.approx(0.003)
