"""Every rank runs the same step: rank 0 forwards what it runs to the other ranks.

Rank 0 (`Leader`, called on its step thread, so the order of control messages is the order
of launches) sends, before its own runner acts: each validated Step as the protobuf bytes the
scheduler sent, each reset, and for a late-masks step the StepMasks it waited for (or that
the wait failed). The other ranks (`serve_rank`) apply the same calls to their own runner, so
request state, slot lists, penalties and sampled tokens are the same on every rank; only rank
0's outputs are read back and replied.

Sampling runs on every rank, identically, instead of once on rank 0 with a broadcast: the
sampler is a pure function of (logits, seed, position) and the logits after the all-gather are
the same bits on every rank, so every rank's `last_tokens` (the next decode's input, kept on
the device) is right with no extra collective per step and nothing for a decode to wait on.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from model_service.runner import InFlight, ModelRunner, StepError
from model_service.tp.comm import MASKS, MASKS_FAILED, RESET, STEP, TPComm
from model_service.tp.group import fatal
from radixmesh_wire.mask_rows import EncodedRow
from radixmesh_wire.pb import model_pb2
from radixmesh_wire.step_codec import decode_masks, decode_step

log = structlog.get_logger(__name__)

Masks = tuple[dict[int, EncodedRow], set[int]]


class Leader:
    """Rank 0's side of the control channel (all calls on the step thread)."""

    def __init__(self, comm: TPComm) -> None:
        self.comm = comm

    def step(self, step: model_pb2.Step) -> None:
        self._send(STEP, step.SerializeToString())

    def reset(self) -> None:
        self._send(RESET)

    def masks_source(self, wait: Callable[[int], tuple[Masks, bytes]]) -> Callable[[int], Masks]:
        """The runner's mask source on rank 0: wait as before, then forward what came (or that
        nothing usable did: the other ranks fail the step the same way)."""

        def source(step_id: int) -> Masks:
            try:
                masks, raw = wait(step_id)
            except StepError as exc:
                self._send(MASKS_FAILED, f"{type(exc).__name__}: {exc}".encode())
                raise
            self._send(MASKS, raw)
            return masks

        return source

    def _send(self, tag: bytes, payload: bytes = b"") -> None:
        try:
            self.comm.send(tag, payload)
        except Exception as exc:  # noqa: BLE001 - a rank is gone: the group ends
            fatal("sending to the other ranks", exc)


def _masks_from(comm: TPComm) -> Callable[[int], Masks]:
    def source(step_id: int) -> Masks:
        tag, payload = comm.recv()
        if tag == MASKS_FAILED:
            raise StepError(payload.decode(errors="replace"))
        if tag != MASKS:
            raise RuntimeError(f"control message {tag!r} where masks of step {step_id} were due")
        late = decode_masks(model_pb2.StepMasks.FromString(payload))
        return late.rows, set(late.skip)

    return source


def serve_rank(runner: ModelRunner, comm: TPComm) -> None:
    """Ranks 1..N-1: run every step rank 0 runs, until the group ends (never returns)."""
    runner.mask_source = _masks_from(comm)
    prev: InFlight | None = None
    while True:
        try:
            tag, payload = comm.recv()
            if tag == RESET:
                if prev is not None:
                    runner.finish(prev)
                    prev = None
                runner.reset()
            elif tag == STEP:
                ops = decode_step(model_pb2.Step.FromString(payload))
                try:
                    fl = runner.launch(ops)
                except StepError as exc:  # rank 0 failed it the same way
                    log.warning("step_rejected", step=ops.step_id, error=str(exc))
                    continue
                if prev is not None:  # as rank 0: launch N+1, then finish N
                    runner.finish(prev)
                prev = fl
            else:
                raise RuntimeError(f"unknown control message {tag!r}")
        except Exception as exc:  # noqa: BLE001 - out of step with rank 0: the group ends
            fatal(f"rank {comm.rank} running a step", exc)
