"""Front-door metrics: in-flight streams, request outcomes, and the latencies a client sees
(time to first token, inter-token latency, end-to-end). One `RequestTimer` per Generate call;
it observes once per delta the scheduler sends (not once per token) and once at the end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.metrics import (
    LATENCY_BUCKETS,
    STEP_BUCKETS,
    Reading,
    StatsCollector,
    name,
    new_registry,
)

if TYPE_CHECKING:
    from tokenizer_service.routing.replica_set import ReplicaSet


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

    def watch_replicas(self, replicas: ReplicaSet) -> None:
        """Routing decisions and per-replica state, read from the replica set at scrape time
        (routing itself does no metric work)."""
        self.registry.register(StatsCollector(lambda: replica_readings(replicas)))


def replica_readings(replicas: ReplicaSet) -> Iterator[Reading]:
    for address, counts in list(replicas.counts.items()):
        for reason, n in list(counts.by_reason.items()):
            yield Reading(
                "router_decisions",
                "counter",
                "Requests this front door routed, by replica and reason.",
                n,
                (("replica", address), ("reason", reason)),
            )
        yield Reading(
            "router_failovers",
            "counter",
            "Live requests moved to this replica because theirs went down.",
            counts.moved_in,
            (("replica", address),),
        )
    for address, link in list(replicas.links.items()):
        lab = (("replica", address),)
        v = link.view
        gauges = (
            ("connected", "1 while the session to the replica is up.", link.connected.is_set()),
            ("serving", "1 while the replica's scheduler is ready (model up).", link.serving),
            ("draining", "1 while the replica drains (gone from discovery).", link.draining),
            ("load_tokens", "The router's load estimate of the replica (tokens).", v.load_tokens),
            ("load_requests", "The router's load estimate (requests).", v.load_requests),
            ("cached_blocks", "Prefix-cache blocks the router knows it holds.", len(v.blocks)),
            ("inflight", "This front door's live requests on the replica.", len(link.live)),
        )
        for short, help_, value in gauges:
            yield Reading(f"router_replica_{short}", "gauge", help_, float(value), lab)


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
