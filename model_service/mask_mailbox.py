"""Late grammar masks (`StepMasks`) on their way from the step stream's reader (the event
loop) to the step thread, whose launch of a masks_follow step waits for them (server.py).

A step's masks come at most once and are waited for at most `wait_s` (`--mask-wait-s`); a
step that is not waiting for masks gets no box, so a peer cannot grow this by sending masks.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import structlog

from model_service.runner_state import StepError
from radixmesh_wire.mask_rows import EncodedRow
from radixmesh_wire.pb import model_pb2
from radixmesh_wire.step_codec import decode_masks

log = structlog.get_logger(__name__)

Masks = tuple[dict[int, EncodedRow], set[int]]


class MaskTimeout(StepError):
    """A masks_follow step's masks did not come in time: the step's rows fail, the step
    thread is free again. (The scheduler maps this name to UNAVAILABLE.)"""


class MaskMailbox:
    """StepMasks by step id, from the stream reader (event loop) to the step thread.

    Only steps read with masks_follow (`expect`) get a box: masks for any other step id are
    dropped, so a peer cannot grow this by sending StepMasks nobody waits for."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._boxes: dict[int, Future[tuple[Masks, bytes]]] = {}  # with the message's bytes
        self._closed = False

    def expect(self, step_id: int) -> None:
        self._box(step_id)

    def _box(self, step_id: int) -> Future[tuple[Masks, bytes]]:
        with self._lock:
            box = self._boxes.get(step_id)
            if box is None:
                box = self._boxes[step_id] = Future()
                if self._closed:
                    box.set_exception(StepError("the step session closed"))
            return box

    def deliver(self, msg: model_pb2.StepMasks) -> None:
        with self._lock:
            box = self._boxes.get(msg.step_id)
        if box is None:
            log.warning("masks_dropped", step=msg.step_id, reason="no step waits for them")
            return
        if box.done():
            return
        try:
            late = decode_masks(msg)
        except ValueError as exc:  # the step that waits for them fails, not the session
            box.set_exception(StepError(f"the masks of step {msg.step_id}: {exc}"))
            return
        box.set_result(((late.rows, set(late.skip)), msg.SerializeToString()))

    def wait(self, step_id: int) -> Masks:
        return self.wait_raw(step_id)[0]

    def wait_raw(self, step_id: int) -> tuple[Masks, bytes]:
        """The masks and the StepMasks bytes they came in (tensor parallelism forwards them)."""
        box = self._box(step_id)
        try:
            return box.result(timeout=self.wait_s)
        except TimeoutError as exc:
            raise MaskTimeout(
                f"the grammar masks of step {step_id} did not come in {self.wait_s} s "
                "(--mask-wait-s)"
            ) from exc
        finally:
            with self._lock:
                self._boxes.pop(step_id, None)

    def discard(self, step_id: int) -> None:
        """A step that failed before waiting for its masks: they are not wanted any more."""
        with self._lock:
            self._boxes.pop(step_id, None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for box in self._boxes.values():
                if not box.done():
                    box.set_exception(StepError("the step session closed"))
