"""Front-door metrics: in-flight streams, request outcomes, and the latencies a client sees
(time to first token, inter-token latency, end-to-end). One `RequestTimer` per Generate call;
it records once per event the stream sends (not once per token) and once at the end.

The inter-token latency counts one sample per token, as SGLang's does (an event of n tokens
after a gap g: n samples of g / n), and costs one bucket lookup per event whatever n is
(`TokenGaps`: a histogram kept in plain Python numbers and read at scrape time; a
prometheus_client `observe` per event cost ~3 us, ~5 % of the front door's CPU per event)."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from services.metrics import LATENCY_BUCKETS, STEP_BUCKETS, Reading, ServiceMetrics, name

if TYPE_CHECKING:
    from tokenizer_service.routing.replica_set import ReplicaSet
    from tokenizer_service.routing.replica_view import Load


class FrontDoorMetrics(ServiceMetrics):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.inflight = self.gauge("frontdoor_inflight_streams", "Generate streams open now.")
        self.requests = self.counter("num_requests", "Generate calls received.")
        self.success = self.counter(
            "request_success", "Generate calls that completed, by finish reason.", ["finish_reason"]
        )
        self.failure = self.counter(
            "request_failure",
            "Generate calls that ended with an error status or a client cancel, by reason.",
            ["reason"],
        )
        # Series a dashboard queries exist from the start (at 0), not from their first event.
        for reason in ("stop", "length"):
            self.success.labels(reason)
        self.failure.labels("cancelled")
        self.prompt_tokens = self.counter(
            "frontdoor_prompt_tokens", "Prompt tokens of completed calls."
        )
        self.generation_tokens = self.counter(
            "frontdoor_generation_tokens", "Tokens returned by completed calls."
        )
        self.ttft = self.histogram(
            "time_to_first_token_seconds",
            "Time from the call's arrival to its first output token.",
            LATENCY_BUCKETS,
        )
        self.itl = TokenGaps(
            name("inter_token_latency_seconds"),
            "Time between output tokens (one sample per token: an event's gap over its tokens).",
            STEP_BUCKETS,
        )
        self.registry.register(self.itl)
        self.hold = TokenGaps(
            name("frontdoor_token_hold_seconds"),
            "Time from a token's arrival at the front door to the event that carries it out, "
            "for the oldest token of each event (the event budget's hold, docs/front_door.md).",
            STEP_BUCKETS,
        )
        self.registry.register(self.hold)
        self.e2e = self.histogram(
            "e2e_request_latency_seconds",
            "Time from the call's arrival to its last response.",
            LATENCY_BUCKETS,
        )

    def start(self) -> RequestTimer:
        return RequestTimer(self)

    def watch_replicas(self, replicas: ReplicaSet) -> None:
        """Routing decisions and per-replica state, read from the replica set at scrape time
        (routing itself does no metric work)."""
        self.readings(lambda: replica_readings(replicas))


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
            ("cached_host_blocks", "Of those, the ones in its host KV tier.", v.host_blocks),
            ("inflight", "This front door's live requests on the replica.", len(link.live)),
        )
        for short, help_, value in gauges:
            yield Reading(f"router_replica_{short}", "gauge", help_, float(value), lab)
        yield from _reported(v.reported, lab)


def _reported(load: Load | None, lab: tuple[tuple[str, str], ...]) -> Iterator[Reading]:
    """The replica's own last LoadReport, under the scheduler's names with a `replica` label,
    so the one address a user knows shows what SGLang's `/metrics` shows."""
    if load is None:
        return
    used = 1.0 - load.kv_free / load.kv_capacity if load.kv_capacity else 0.0
    gauges = (
        (
            "num_running_reqs",
            "Requests running on the replica (its last load report).",
            load.running_requests,
        ),
        (
            "num_queue_reqs",
            "Requests waiting on the replica (its last load report).",
            load.waiting_requests,
        ),
        (
            "cache_hit_rate",
            "The replica's prefix-cache hit rate (its last load report).",
            load.cache_hit_rate,
        ),
        ("token_usage", "Fraction of the replica's KV not free or evictable (last report).", used),
    )
    for short, help_, value in gauges:
        yield Reading(f"replica_{short}", "gauge", help_, float(value), lab)


class TokenGaps(Collector):
    """A histogram of the gaps between tokens, one sample per token: `observe(gap, n)` counts
    n samples of gap / n with one bucket lookup (C bisect) and two additions. Owned by the
    event loop's thread; a scrape (another thread) copies the counts and may miss the event
    being recorded, never reads a torn number. Exposed as a Prometheus histogram (`_bucket`
    with `le`, `_count`, `_sum`) under the same name and buckets as before."""

    def __init__(self, full_name: str, help_: str, bounds: Sequence[float]) -> None:
        self.name = full_name
        self.help = help_
        self.bounds = list(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, gap: float, n: int) -> None:
        """n tokens arrived `gap` seconds after the previous ones (n >= 1)."""
        self.counts[bisect_left(self.bounds, gap / n)] += n
        self.sum += gap

    @property
    def count(self) -> int:
        return sum(self.counts)

    def collect(self) -> Iterator[Metric]:
        counts, total = list(self.counts), self.sum
        fam = HistogramMetricFamily(self.name, self.help)
        buckets: list[tuple[str, float]] = []
        acc = 0
        for bound, c in zip([*self.bounds, float("inf")], counts, strict=True):
            acc += c
            buckets.append((floatToGoString(bound), float(acc)))
        fam.add_metric([], buckets, sum_value=total)
        yield fam

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.help)


class RequestTimer:
    """One Generate call. Invariant: exactly one of `succeeded` / `failed` counts it, and the
    in-flight gauge goes up in the constructor and down once, when the call ends: at its
    outcome (before the final message leaves, so a client that has its answer never scrapes
    its own stream as still open) or at `close` (the handler's finally), whichever is first."""

    __slots__ = ("m", "t0", "first", "last", "ended", "closed")

    def __init__(self, m: FrontDoorMetrics) -> None:
        self.m = m
        self.t0 = time.perf_counter()
        self.first = 0.0  # time of the first token delta (0: none yet)
        self.last = 0.0  # time of the latest token delta (0: none yet)
        self.ended = False
        self.closed = False
        m.requests.inc()
        m.inflight.inc()

    def tokens(self, n: int, oldest: float = 0.0) -> None:
        """An event of n tokens leaves now: the first is the time to first token, the later
        ones n inter-token samples (the gap since the previous event over n). `oldest`: when
        the event's oldest token reached the front door (perf_counter; 0: unknown), one sample
        of the hold."""
        if n <= 0:
            return
        now = time.perf_counter()
        if oldest:
            self.m.hold.observe(now - oldest, 1)
        if self.last == 0.0:
            self.first = now
            self.m.ttft.observe(now - self.t0)
        else:
            self.m.itl.observe(now - self.last, n)
        self.last = now

    def succeeded(self, finish_reason: str, prompt_tokens: int, output_tokens: int) -> None:
        if self.ended:
            return
        self.ended = True
        self._leave()
        self.m.success.labels(finish_reason).inc()
        self.m.prompt_tokens.inc(prompt_tokens)
        self.m.generation_tokens.inc(output_tokens)
        self.m.e2e.observe(time.perf_counter() - self.t0)

    def failed(self, reason: str) -> None:
        if self.ended:
            return
        self.ended = True
        self._leave()
        self.m.failure.labels(reason).inc()

    def close(self) -> None:
        """Ends the call: one not yet counted was cancelled by its client (or its deadline)."""
        self.failed("cancelled")

    def _leave(self) -> None:
        if not self.closed:
            self.closed = True
            self.m.inflight.dec()
