"""Grammar service metrics: compile-cache hits / misses / errors / evictions and its size are
read from `CacheStats` at scrape time; compile time and mask-step latency are histograms
observed once per compile and once per mask step."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry

from grammar_service.compile_cache import CacheStats
from services.metrics import LATENCY_BUCKETS, STEP_BUCKETS, Reading, ServiceMetrics


class GrammarMetrics(ServiceMetrics):
    def __init__(self, stats: CacheStats, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self._stats = stats
        self.compile_time = self.histogram(
            "grammar_compile_seconds",
            "Time to compile one grammar (cache misses only).",
            LATENCY_BUCKETS,
        )
        self.mask_time = self.histogram(
            "grammar_mask_seconds",
            "Service time of one mask step (all rows of a scheduler step).",
            STEP_BUCKETS,
        )
        self.readings(self._read)

    def _read(self) -> Iterator[Reading]:
        s = self._stats
        yield Reading("grammar_cache_hits", "counter", "Compiled-grammar cache hits.", s.hits)
        yield Reading("grammar_cache_misses", "counter", "Compiles started.", s.misses)
        yield Reading("grammar_compile_errors", "counter", "Compiles that failed.", s.errors)
        yield Reading("grammar_cache_evictions", "counter", "Grammars evicted.", s.evictions)
        yield Reading("grammar_cache_entries", "gauge", "Compiled grammars cached.", s.entries)
        yield Reading("grammar_cache_bytes", "gauge", "Bytes of compiled grammars.", s.nbytes)
