"""The model service's per-step input staging (`model_service/transfer.py::HostStager`).

On CUDA a step's small inputs are packed into one reused pinned buffer and sent in one copy;
these tests run that staged path on CPU (`stage_on_cpu`) and check that every tensor comes back
exactly as `torch.tensor` would make it, that items never overlap whatever their sizes, and
that a buffer is rewritten only after the copy that last read it has run."""

from __future__ import annotations

import numpy as np
import torch

from model_service.transfer import Concat, HostStager, Staged, layout

CPU = torch.device("cpu")


class _Event:
    """A CUDA event stand-in: not passed until the test says so; counts host waits."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.passed = False

    def record(self) -> None:
        self.log.append("record")

    def query(self) -> bool:
        return self.passed

    def synchronize(self) -> None:
        self.log.append("wait")
        self.passed = True


def _items(rng: np.random.Generator) -> list[Staged]:
    return [
        (rng.integers(0, 1 << 40, int(rng.integers(0, 9))).tolist(), torch.int64),
        ([float(x) for x in rng.random(int(rng.integers(0, 5)))], torch.float32),
        (Concat([rng.integers(0, 1000, int(rng.integers(0, 7))) for _ in range(3)]), torch.int64),
        ([], torch.int64),
        (rng.integers(-5, 5, 3).astype(np.int32), torch.int32),
    ]


def _expected(v: object, dt: torch.dtype) -> torch.Tensor:
    if isinstance(v, Concat):
        return torch.tensor(np.concatenate(v.parts).tolist() if v.parts else [], dtype=dt)
    if isinstance(v, np.ndarray):
        return torch.tensor(v.tolist(), dtype=dt)
    return torch.tensor(v, dtype=dt)


def test_staged_tensors_equal_what_torch_tensor_makes_and_never_overlap() -> None:
    rng = np.random.default_rng(7)
    stager = HostStager(
        CPU, depth=3, initial_bytes=16, stage_on_cpu=True, new_event=lambda: _Event([])
    )
    for _ in range(50):
        items = _items(rng)
        offsets, end = layout(items)
        spans = sorted(
            (o, o + len(v) * dt.itemsize) for (v, dt), o in zip(items, offsets, strict=True)
        )
        assert all(a % 16 == 0 for a, _ in spans)
        assert all(b0 <= a1 for (_, b0), (a1, _) in zip(spans, spans[1:], strict=False))
        assert spans[-1][1] <= end
        out = stager.send(items)
        for (v, dt), t in zip(items, out, strict=True):
            assert t.dtype == dt
            assert torch.equal(t, _expected(v, dt))


def test_a_buffer_is_rewritten_only_after_its_last_copy_ran() -> None:
    log: list[str] = []
    events: list[_Event] = []

    def new_event() -> _Event:
        events.append(_Event(log))
        return events[-1]

    stager = HostStager(CPU, depth=2, stage_on_cpu=True, new_event=new_event)
    first = stager.send([([1, 2, 3], torch.int64)])
    assert torch.equal(first[0], torch.tensor([1, 2, 3]))
    stager.send([([4], torch.int64)])
    assert log == ["record", "record"] and stager.waits == 0
    # The third batch reuses the first buffer: its copy has not run, so the host waits.
    stager.send([([5, 6], torch.int64)])
    assert log == ["record", "record", "wait", "record"] and stager.waits == 1
    # The fourth reuses the second buffer, whose copy has run by now: no wait.
    events[1].passed = True
    stager.send([([7], torch.int64)])
    assert stager.waits == 1 and stager.sends == 4


def test_a_batch_larger_than_its_buffer_grows_it() -> None:
    stager = HostStager(
        CPU, depth=1, initial_bytes=16, stage_on_cpu=True, new_event=lambda: _Event([])
    )
    stager.send([([1], torch.int64)])
    big_values = list(range(1000))
    big = stager.send([(big_values, torch.int64), ([0.5] * 7, torch.float32)])
    assert torch.equal(big[0], torch.tensor(big_values))
    assert torch.equal(big[1], torch.full((7,), 0.5))


def test_without_staging_each_item_is_its_own_tensor() -> None:
    out = HostStager(CPU).send([([3, 4], torch.int64), (Concat([np.arange(3)]), torch.int64)])
    assert torch.equal(out[0], torch.tensor([3, 4]))
    assert torch.equal(out[1], torch.arange(3))
