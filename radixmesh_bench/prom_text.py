"""Read a service's Prometheus /metrics page: what each scheduler itself counted, for benches
that must not take a router's word for where requests went.

Parsing is prometheus-client's own text-format parser; this module only indexes the samples
by (sample name, labels) and fetches pages. Counters appear under their sample names, i.e.
with the `_total` suffix (`radixmesh_finished_requests_total`).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]


def parse(text: str) -> Samples:
    """Every sample of a text-format page, keyed by (sample name, sorted label pairs)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def value(samples: Samples, name: str, labels: Mapping[str, str] | None = None) -> float:
    """One sample's value; KeyError naming the sample when the page lacks it."""
    key = (name, tuple(sorted((labels or {}).items())))
    if key not in samples:
        raise KeyError(f"no sample {name}{dict(labels or {})} on the metrics page")
    return samples[key]


def scrape(url: str, timeout: float = 5.0) -> Samples:
    """GET a /metrics page (plain HTTP: the services serve metrics without TLS) and parse it."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (our own URL)
        return parse(resp.read().decode("utf-8"))
