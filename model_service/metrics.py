"""Model service metrics: forward time per step (launch to tokens read back) and the rows
and tokens each step computes, plus the KV pool's size. Observed once per step."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry

from services.metrics import BATCH_BUCKETS, STEP_BUCKETS, Reading, ServiceMetrics


class ModelMetrics(ServiceMetrics):
    def __init__(self, kv_capacity: int, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.forward = self.histogram(
            "model_forward_seconds",
            "One step on the worker: launched until its sampled tokens are read back.",
            STEP_BUCKETS,
        )
        self.rows = self.histogram("model_batch_size", "Rows of one forward step.", BATCH_BUCKETS)
        self.steps = self.counter("model_steps", "Steps run, by outcome.", ["outcome"])
        self._kv_capacity = kv_capacity
        self.readings(self._read)

    def observe(self, seconds: float, rows: int) -> None:
        self.forward.observe(seconds)
        self.rows.observe(rows)
        self.steps.labels("ok").inc()

    def failed(self) -> None:
        self.steps.labels("error").inc()

    def _read(self) -> Iterator[Reading]:
        yield Reading("kv_pool_tokens", "gauge", "KV pool capacity in tokens.", self._kv_capacity)
