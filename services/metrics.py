"""Prometheus metrics shared by every service: one registry per process, served in the
Prometheus text format on `--metrics-port` by prometheus-client's own HTTP thread.

Multi-process safety is by construction: every service is its own OS process with its own
registry and its own port, so no shared-directory multiprocess mode is needed. Names follow
SGLang's (`sglang:num_running_reqs` ...) with a plain `radixmesh_` prefix: a colon is reserved
for recording rules, and a Prometheus that asks for OpenMetrics with `escaping=underscores`
(3.x) would store `radixmesh_x` samples under a `radixmesh:x` HELP/TYPE, so a colon name is
stored under a name no dashboard asks for. Plain names are the same in every exposition format.

`ServiceMetrics` is the one set-up every service's metrics class stands on: a fresh registry,
named histograms / counters / gauges, scrape-time readings, and serving on `--metrics-port`.

Hot paths stay cheap: counters that services already keep in plain dataclasses are read at
scrape time by a `StatsCollector` (no per-token work at all); histograms are observed once
per step or once per request, never per token of every request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import structlog
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = structlog.get_logger(__name__)

PREFIX = "radixmesh_"

# Latency buckets (seconds): SGLang's TTFT/E2E spread, from 1 ms to 10 min.
LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
# Per-token and per-step times are much shorter: 100 us .. 10 s.
STEP_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def name(short: str) -> str:
    return PREFIX + short


def new_registry() -> CollectorRegistry:
    """A fresh registry with the process, platform and GC collectors: every service gets its
    own, so building two services' metrics in one test process never collides."""
    reg = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    GCCollector(registry=reg)
    return reg


def serve_metrics(registry: CollectorRegistry, host: str, port: int, service: str) -> bool:
    """Serve /metrics on host:port from a daemon thread; port 0 turns metrics off.

    The thread only renders the registry; collectors read plain counters, which the GIL keeps
    consistent enough for monitoring (a scrape may see a step half applied, never torn ints)."""
    if port <= 0:
        return False
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise SystemExit(f"{service}: cannot serve metrics on {host}:{port}: {exc}") from exc
    log.info("metrics_listening", address=f"{host}:{port}", path="/metrics")
    return True


class ServiceMetrics:
    """The shared part of every service's metrics: one registry with the process collectors,
    metric constructors that apply the `radixmesh_` prefix, and scrape-time readings."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or new_registry()

    def histogram(
        self, short: str, help_: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> Histogram:
        return Histogram(name(short), help_, labels, buckets=buckets, registry=self.registry)

    def counter(self, short: str, help_: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name(short), help_, labels, registry=self.registry)

    def gauge(self, short: str, help_: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name(short), help_, labels, registry=self.registry)

    def readings(self, read: Callable[[], Iterable[Reading]]) -> None:
        """Adds values read at scrape time (see `StatsCollector`)."""
        self.registry.register(StatsCollector(read))

    def serve(self, host: str, port: int, service: str) -> bool:
        return serve_metrics(self.registry, host, port, service)


@dataclass(frozen=True)
class Reading:
    """One scrape-time value: `kind` is "counter" or "gauge"; `labels` pairs label values."""

    short: str
    kind: str
    help: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()


class StatsCollector(Collector):
    """Turns a callable's readings into metric families at scrape time.

    Counters a service already keeps for GetStats become Prometheus counters without touching
    the hot path. Readings that share a name must share kind, help and label names."""

    def __init__(self, read: Callable[[], Iterable[Reading]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for r in self.read():
            fam = families.get(r.short)
            if fam is None:
                labels = [k for k, _ in r.labels]
                full = name(r.short)
                fam = (
                    CounterMetricFamily(full, r.help, labels=labels)
                    if r.kind == "counter"
                    else GaugeMetricFamily(full, r.help, labels=labels)
                )
                families[r.short] = fam
            fam.add_metric([v for _, v in r.labels], r.value)  # type: ignore[attr-defined]
        yield from families.values()

    def describe(self) -> Iterator[Metric]:
        return iter(())  # names depend on live state; skip registry-time duplicate checks
