"""Scrape-time readings of a scheduler's grammar services (`GrammarPool`): how many are known
and connected, and per service the matchers it holds and the mask rows it answered."""

from __future__ import annotations

from collections.abc import Iterator

from scheduler_service.grammar.pool import GrammarPool
from services.metrics import Reading


def grammar_readings(pool: GrammarPool) -> Iterator[Reading]:
    connected = pool.connected()
    yield Reading(
        "grammar_services", "gauge", "Grammar services in --grammar-address.", len(pool.links)
    )
    yield Reading(
        "grammar_services_connected",
        "gauge",
        "Grammar services with an open Masks stream.",
        len(connected),
    )
    for address in sorted(set(pool.links) | set(pool.rows_sent)):
        labels = (("service", address),)
        yield Reading(
            "grammar_matchers",
            "gauge",
            "Constrained requests whose matcher lives on this grammar service.",
            pool.placement.live.get(address, 0),
            labels,
        )
        yield Reading(
            "grammar_mask_rows",
            "counter",
            "Mask rows this grammar service answered.",
            pool.rows_sent[address],
            labels,
        )
