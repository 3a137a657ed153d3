"""A step session's host time per part of a step, logged as `step_host_costs` lines
(periodically and when the session closes: server.py)."""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from model_service.copy_stats import CopyStats

log = structlog.get_logger(__name__)


@dataclass
class HostCosts:
    """A session's host time per part of a step (issue 27): decoding the message and encoding
    the result (event loop), the step check and the runner's launch (step thread; each field
    has that one writer). `launch` is host work only while the launch never waits for the
    GPU: near the GPU's step time it means the launch of N+1 waits for step N (an implicit
    sync), which takes the two steps in flight back to one."""

    steps: int = 0
    decode_s: float = 0.0
    check_s: float = 0.0
    launch_s: float = 0.0
    encode_s: float = 0.0

    def log(self, reason: str) -> None:
        n = self.steps
        if n:
            log.info(
                "step_host_costs",
                reason=reason,
                steps=n,
                **{
                    f"{k.removesuffix('_s')}_ms_per_step": round(getattr(self, k) * 1e3 / n, 4)
                    for k in ("decode_s", "check_s", "launch_s", "encode_s")
                },
            )


def log_copies(stats: CopyStats, reason: str) -> None:
    """The host tier's copy totals since the model service started (`host_kv_copies` line,
    beside `step_host_costs`): per direction copies, tokens, bytes and seconds, and the rate."""
    if not (stats.save.copies or stats.load.copies):
        return
    rates = {
        f"{d}_GBps": round(t.bytes / t.seconds / 1e9, 3) if t.seconds else 0.0
        for d, t in (("save", stats.save), ("load", stats.load))
    }
    log.info("host_kv_copies", reason=reason, in_flight=stats.in_flight, **stats.as_dict(), **rates)
