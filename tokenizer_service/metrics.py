"""Front-door metrics: in-flight streams, request outcomes, and the latencies a client sees
(time to first token, inter-token latency, end-to-end). One `RequestTimer` per Generate call;
it observes once per delta the scheduler sends (not once per token) and once at the end."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from radixmesh_server.metrics import LATENCY_BUCKETS, STEP_BUCKETS, name, new_registry


class FrontDoorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or new_registry()
        r = self.registry
        self.inflight = Gauge(
            name("frontdoor_inflight_streams"), "Generate streams open now.", registry=r
        )
        self.requests = Counter(name("num_requests"), "Generate calls received.", registry=r)
        self.success = Counter(
            name("request_success"),
            "Generate calls that completed, by finish reason.",
            ["finish_reason"],
            registry=r,
        )
        self.failure = Counter(
            name("request_failure"),
            "Generate calls that ended with an error status or a client cancel, by reason.",
            ["reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            name("frontdoor_prompt_tokens"), "Prompt tokens of completed calls.", registry=r
        )
        self.generation_tokens = Counter(
            name("frontdoor_generation_tokens"), "Tokens returned by completed calls.", registry=r
        )
        self.ttft = Histogram(
            name("time_to_first_token_seconds"),
            "Time from the call's arrival to its first output token.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            name("inter_token_latency_seconds"),
            "Time between output tokens (one sample per delta: its gap over its tokens).",
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            name("e2e_request_latency_seconds"),
            "Time from the call's arrival to its last response.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def start(self) -> RequestTimer:
        return RequestTimer(self)


class RequestTimer:
    """One Generate call. Invariant: exactly one of `succeeded` / `failed` counts it, and the
    in-flight gauge goes up in the constructor and down in `close` (the handler's finally)."""

    __slots__ = ("m", "t0", "last", "ended", "closed")

    def __init__(self, m: FrontDoorMetrics) -> None:
        self.m = m
        self.t0 = time.perf_counter()
        self.last = 0.0  # time of the latest token delta (0: none yet)
        self.ended = False
        self.closed = False
        m.requests.inc()
        m.inflight.inc()

    def tokens(self, n: int) -> None:
        if n <= 0:
            return
        now = time.perf_counter()
        if self.last == 0.0:
            self.m.ttft.observe(now - self.t0)
        else:
            self.m.itl.observe((now - self.last) / n)
        self.last = now

    def succeeded(self, finish_reason: str, prompt_tokens: int, output_tokens: int) -> None:
        if self.ended:
            return
        self.ended = True
        self.m.success.labels(finish_reason).inc()
        self.m.prompt_tokens.inc(prompt_tokens)
        self.m.generation_tokens.inc(output_tokens)
        self.m.e2e.observe(time.perf_counter() - self.t0)

    def failed(self, reason: str) -> None:
        if self.ended:
            return
        self.ended = True
        self.m.failure.labels(reason).inc()

    def close(self) -> None:
        """Ends the call: one not yet counted was cancelled by its client (or its deadline)."""
        if self.closed:
            return
        self.closed = True
        self.failed("cancelled")
        self.m.inflight.dec()
