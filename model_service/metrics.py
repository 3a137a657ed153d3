"""Model service metrics: forward time per step (launch to tokens read back) and the rows
and tokens each step computes, plus the KV pool's size. Observed once per step. With a host
tier, its copies per direction (save, load): copies, tokens, bytes and seconds (the copy
stream's time on CUDA; ``copy_stats.py``), read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry

from model_service.copy_stats import DIRECTIONS, CopyStats
from services.metrics import BATCH_BUCKETS, STEP_BUCKETS, Reading, ServiceMetrics

# (reading name, CopyStats field, help)
_COPY_READINGS = (
    ("kv_copies", "copies", "Host-tier KV copies run, by direction (save: GPU to host)."),
    ("kv_copy_tokens", "tokens", "Tokens of KV copied to or from the host tier, by direction."),
    ("kv_copy_bytes", "bytes", "Bytes of KV copied to or from the host tier (this rank's)."),
    (
        "kv_copy_seconds",
        "seconds",
        "Time of the completed host-tier copies, by direction (the copy stream's, on CUDA).",
    ),
)


class ModelMetrics(ServiceMetrics):
    def __init__(
        self,
        kv_capacity: int,
        registry: CollectorRegistry | None = None,
        copies: CopyStats | None = None,
    ) -> None:
        super().__init__(registry)
        self.forward = self.histogram(
            "model_forward_seconds",
            "One step on the worker: launched until its sampled tokens are read back.",
            STEP_BUCKETS,
        )
        self.rows = self.histogram("model_batch_size", "Rows of one forward step.", BATCH_BUCKETS)
        self.steps = self.counter("model_steps", "Steps run, by outcome.", ["outcome"])
        self._kv_capacity = kv_capacity
        self._copies = copies
        self.readings(self._read)

    def observe(self, seconds: float, rows: int) -> None:
        self.forward.observe(seconds)
        self.rows.observe(rows)
        self.steps.labels("ok").inc()

    def failed(self) -> None:
        self.steps.labels("error").inc()

    def _read(self) -> Iterator[Reading]:
        yield Reading("kv_pool_tokens", "gauge", "KV pool capacity in tokens.", self._kv_capacity)
        c = self._copies
        if c is None:
            return
        for short, attr, help_ in _COPY_READINGS:
            for d in DIRECTIONS:
                value = getattr(getattr(c, d), attr)
                yield Reading(short, "counter", help_, value, (("direction", d),))
        yield Reading(
            "kv_loads_waited_in_step",
            "counter",
            "Steps whose forward pass waited for their own host-tier loads (a scheduler without "
            "load-ahead; 0 with load-ahead).",
            c.same_step_waits,
        )
