"""The control channel of tensor parallelism (model_service.tp.steps) without processes: what
rank 0's `Leader` sends, the other ranks' `serve_rank` replays on their runner in the same
order, late masks included; a failed mask wait fails the step on every rank; a message out
of order ends the group (instead of running out of step)."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
import torch

from model_service.runner import StepError
from model_service.tp import steps
from radixmesh_wire.step_codec import encode_masks, encode_step
from radixmesh_wire.step_ops import LateMasks, StepOps


class Pipe:
    """Stands in for TPComm: what rank 0 sends, the other rank receives, in order."""

    rank = 1

    def __init__(self) -> None:
        self.q: deque[tuple[bytes, bytes]] = deque()

    def send(self, tag: bytes, payload: bytes = b"") -> None:
        self.q.append((tag, payload))

    def recv(self) -> tuple[bytes, bytes]:
        if not self.q:
            raise EOFError("rank 0 is gone")
        return self.q.popleft()


class Runner:
    """Records the calls serve_rank makes; a masks_follow step asks its mask source."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.mask_source: Any = None

    def launch(self, ops: StepOps) -> int:
        self.calls.append(("launch", ops.step_id))
        if ops.masks_follow:
            masks, skip = self.mask_source(ops.step_id)
            self.calls.append(("masks", sorted(masks), sorted(skip)))
        return ops.step_id

    def finish(self, fl: int) -> None:
        self.calls.append(("finish", fl))

    def reset(self) -> None:
        self.calls.append(("reset",))


class GroupEnded(Exception):
    pass


@pytest.fixture(autouse=True)
def no_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    def fatal(what: str, exc: BaseException) -> None:
        raise GroupEnded(what) from exc

    monkeypatch.setattr(steps, "fatal", fatal)


def _replay(pipe: Pipe) -> tuple[Runner, str]:
    runner = Runner()
    with pytest.raises(GroupEnded) as ended:
        steps.serve_rank(runner, pipe)  # type: ignore[arg-type]
    return runner, str(ended.value)


def test_the_other_rank_replays_steps_resets_and_late_masks_in_order() -> None:
    pipe = Pipe()
    lead = steps.Leader(pipe)  # type: ignore[arg-type]
    lead.reset()
    lead.step(encode_step(StepOps(1)))
    late = LateMasks(2, rows={}, skip=[7])
    source = lead.masks_source(lambda sid: ((({}, {7})), encode_masks(late).SerializeToString()))
    lead.step(encode_step(StepOps(2, masks_follow=True)))
    assert source(2) == ({}, {7})  # rank 0's own launch gets them, and they are forwarded
    lead.reset()
    runner, why = _replay(pipe)
    assert runner.calls == [
        ("reset",),
        ("launch", 1),
        ("launch", 2),
        ("masks", [], [7]),
        ("finish", 1),  # as rank 0: N+1 launched before N is finished
        ("finish", 2),
        ("reset",),
    ]
    assert "rank 1" in why  # the channel closing (rank 0 gone) ends the group


def test_a_failed_mask_wait_fails_the_step_on_every_rank() -> None:
    pipe = Pipe()
    lead = steps.Leader(pipe)  # type: ignore[arg-type]

    def timeout(step_id: int) -> Any:
        raise StepError(f"the grammar masks of step {step_id} did not come")

    source = lead.masks_source(timeout)
    lead.step(encode_step(StepOps(5, masks_follow=True)))
    with pytest.raises(StepError):
        source(5)
    lead.step(encode_step(StepOps(6)))
    runner, _ = _replay(pipe)
    # Step 5 failed on this rank too (no finish for it); step 6 ran normally after it.
    assert runner.calls == [("launch", 5), ("launch", 6)]


def test_a_message_out_of_order_ends_the_group() -> None:
    pipe = Pipe()
    pipe.send(b"M", b"")  # masks nobody waits for
    runner, why = _replay(pipe)
    assert runner.calls == [] and "running a step" in why


def test_step_threads_pin_a_named_gpu_and_leave_a_bare_cuda_alone() -> None:
    """A bare "cuda" device (one GPU at TP1) must not get an initializer that calls
    torch.cuda.set_device: it refuses a device without an index, and a failed initializer
    breaks the step pool for good (every Steps session then failed on the H100)."""
    from model_service.server import _device_setter

    assert _device_setter(torch.device("cpu")) is None
    assert _device_setter(torch.device("cuda")) is None
    assert callable(_device_setter(torch.device("cuda", 1)))
