"""The runner's accounting of bursts of steps, logged as one `step_burst` line per burst
(the load test and the GPU stack bench read their per-step figures from these lines).

`StepBursts` owns the accounting state; the `ModelRunner` (`runner.py`) holds one and its
`finish` calls `account` once per step, so the accounting sees every step in order.
"""

from __future__ import annotations

import structlog
import torch

from model_service.runner_state import InFlight

log = structlog.get_logger(__name__)

BURST_IDLE_S = 0.5  # a pause this long between steps ends a burst (see StepBursts.account)


def empty_burst() -> list[float]:
    """[steps, s inside launch..finish, s between steps, GPU busy ms, GPU idle ms, s waiting
    for late masks, GPU ms idle waiting for them, rows sampled, input positions, steps a CUDA
    graph ran]."""
    return [0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0]


class StepBursts:
    """The figures of the current burst of steps (`burst`: fields as `empty_burst`)."""

    def __init__(self) -> None:
        self.burst: list[float] = empty_burst()
        self._last_end: float | None = None  # host time the previous step finished
        self._last_done: torch.cuda.Event | None = None  # the previous step's end on the GPU

    def account(self, fl: InFlight, t1: float) -> None:
        """Per burst of steps: wall time from launch to finish, the host's time between a
        finish and the next launch, and on CUDA the GPU's own view from events: busy from the
        forward pass to the step's end, idle from the previous step's end to this forward
        (with launch-ahead, ~0 when the next step was queued in time). Logged once per burst,
        when a pause over BURST_IDLE_S ends it."""
        b = self.burst
        if self._last_end is not None:
            gap = fl.t0 - self._last_end
            if gap > BURST_IDLE_S:
                self.log_burst()
                b = self.burst  # log_burst starts a new list: count this step in it
                self._last_done = None
            else:
                b[2] += max(gap, 0.0)
        if fl.done is not None and fl.gpu_start is not None:
            b[3] += fl.gpu_start.elapsed_time(fl.done)
            if self._last_done is not None:
                b[4] += max(self._last_done.elapsed_time(fl.gpu_start), 0.0)
        if fl.done is not None:
            self._last_done = fl.done
        b[5] += fl.mask_wait_s
        if fl.fwd_done is not None and fl.sample_start is not None:
            b[6] += fl.fwd_done.elapsed_time(fl.sample_start)
        b[0] += 1
        b[1] += t1 - fl.t0
        b[7] += len(fl.handles)
        b[8] += fl.tokens_in
        b[9] += fl.graphed
        self._last_end = t1

    def log_burst(self) -> None:
        steps, busy, gap, gpu_busy, gpu_idle, mask_wait, gpu_mask_wait, rows, pos, graphed = (
            self.burst
        )
        if steps >= 2:
            n = int(steps)
            masks = {}
            if mask_wait:  # late-mask steps ran: the host's and the GPU's wait for masks
                masks = {
                    "mask_wait_ms_per_step": round(mask_wait * 1e3 / n, 3),
                    "gpu_mask_wait_ms_per_step": round(gpu_mask_wait / n, 3),
                }
            log.info(
                "step_burst",
                **masks,
                steps=n,
                busy_ms=round(busy * 1e3, 2),
                between_ms=round(gap * 1e3, 2),
                busy_ms_per_step=round(busy * 1e3 / n, 3),
                between_ms_per_step=round(gap * 1e3 / (n - 1), 3),
                gpu_busy_ms_per_step=round(gpu_busy / n, 3),
                gpu_idle_ms_per_step=round(gpu_idle / (n - 1), 3),
                gpu_idle_fraction=round(gpu_idle / (gpu_busy + gpu_idle), 4) if gpu_busy else 0.0,
                # What the steps ran: big eager steps cost the host more launches than graphed.
                rows_per_step=round(rows / n, 1),
                positions_per_step=round(pos / n, 1),
                graphed_fraction=round(graphed / n, 3),
            )
        self.burst = empty_burst()
