"""The arithmetic of `radixmesh bench router`'s report, pure (fixed inputs in, numbers out).

- Hit rate comes from the responses alone: sum(cached_tokens) / sum(prompt_tokens) over the
  measured requests, whatever the router or the schedulers claim.
- Requests per replica come from each scheduler's own /metrics counters (the difference of
  `radixmesh_finished_requests_total` across the measured run), never from the router.
- Balance is max / mean of those counts (1.0: perfectly even).
- The goals are issue 16's: cache_aware's hit rate within 5 % of the single replica's, at least
  twice round_robin's on GSP with 4 replicas, max/mean at most 1.25 on the uniform workload,
  and the skewed workload not piling onto one replica (max/mean at most SKEWED_LIMIT).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixmesh_bench.prom_text import Samples
from radixmesh_bench.stack import pct

FINISHED = "radixmesh_finished_requests_total"
EVICTED = "radixmesh_evicted_tokens_total"
ROUTED = "radixmesh_router_decisions_total"  # front doors', labels replica and reason
PROMPT = "radixmesh_prompt_tokens_total"
CACHED = "radixmesh_cached_tokens_total"

HIT_VS_SINGLE = 0.95  # cache_aware / single replica hit rate, at least
HIT_VS_ROUND_ROBIN = 2.0  # cache_aware / round_robin on GSP with GSP_REPLICAS, at least
GSP_REPLICAS = 4
UNIFORM_LIMIT = 1.25  # max/mean requests per replica on the uniform workload, at most
# One replica taking every hot request of the skewed workload (80 % hot on 4 replicas) is
# max/mean >= 3.2; a router that spills the hot prefix once its replica is loaded stays near 1.
SKEWED_LIMIT = 1.5


@dataclass(frozen=True)
class Outcome:
    """One measured request, as its response reported it."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    latency_s: float
    ttft_s: float
    error: str = ""  # empty when it succeeded


def hit_rate(outcomes: Sequence[Outcome]) -> float:
    ok = [o for o in outcomes if not o.error]
    prompt = sum(o.prompt_tokens for o in ok)
    return sum(o.cached_tokens for o in ok) / prompt if prompt else 0.0


def counter_deltas(
    before: Mapping[str, Samples], after: Mapping[str, Samples], sample: str
) -> dict[str, float]:
    """Per service (same keys as `before`): how much `sample` (no labels) grew. A page
    without the sample counts 0 (a scheduler exports its counters only once it has a model
    session, so one that never got one has counted nothing)."""
    key = (sample, ())
    return {name: after[name].get(key, 0.0) - before[name].get(key, 0.0) for name in before}


def label_deltas(
    before: Mapping[str, Samples], after: Mapping[str, Samples], sample: str, label: str
) -> dict[str, float]:
    """How much `sample` grew, summed over every service and every other label, by the value
    of `label` (a labelled counter that appeared during the run grew from 0)."""
    out: dict[str, float] = {}
    for name, now in after.items():
        then = before.get(name, {})
        for (sname, labels), v in now.items():
            if sname != sample:
                continue
            key = dict(labels).get(label, "")
            out[key] = out.get(key, 0.0) + v - then.get((sname, labels), 0.0)
    return {k: v for k, v in sorted(out.items()) if v}


def max_over_mean(counts: Sequence[float]) -> float:
    """max / mean of per-replica counts: 1.0 is even; N means one replica of N took all."""
    mean = sum(counts) / len(counts) if counts else 0.0
    return max(counts) / mean if mean else 0.0


def summarize_run(
    outcomes: Sequence[Outcome],
    wall_s: float,
    before: Mapping[str, Samples],
    after: Mapping[str, Samples],
    routed_before: Mapping[str, Samples] | None = None,
    routed_after: Mapping[str, Samples] | None = None,
) -> dict[str, Any]:
    """One configuration's numbers: responses for hit rate and latency, the schedulers' own
    counters (before/after the run, keyed by scheduler name) for where the requests went and
    what their caches evicted, and the front doors' (`routed_*`) for why each request went
    where it did."""
    ok = [o for o in outcomes if not o.error]
    finished = counter_deltas(before, after, FINISHED)
    prompt = counter_deltas(before, after, PROMPT)
    cached = counter_deltas(before, after, CACHED)
    per_replica = [int(finished[name]) for name in sorted(finished)]
    sched_prompt = sum(prompt.values())
    lat = sorted(o.latency_s for o in ok)
    ttft = sorted(o.ttft_s for o in ok)
    out_tokens = sum(o.completion_tokens for o in ok)
    errors = [o.error for o in outcomes if o.error]
    return {
        "requests": len(outcomes),
        "errors": len(errors),
        "first_errors": errors[:3],
        "prompt_tokens": sum(o.prompt_tokens for o in ok),
        "cached_tokens": sum(o.cached_tokens for o in ok),
        "hit_rate": round(hit_rate(outcomes), 4),
        # The schedulers' own count (admitted prompt tokens, so a retracted request counts
        # again when re-admitted): a cross-check of the responses' figure.
        "scheduler_hit_rate": round(sum(cached.values()) / sched_prompt, 4) if sched_prompt else 0,
        "requests_per_replica": per_replica,
        "max_over_mean": round(max_over_mean(per_replica), 4),
        "evicted_tokens_per_replica": [
            int(v) for _, v in sorted(counter_deltas(before, after, EVICTED).items())
        ],
        "route_reasons": {
            k: int(v)
            for k, v in label_deltas(
                routed_before or {}, routed_after or {}, ROUTED, "reason"
            ).items()
        },
        "output_tokens": out_tokens,
        "wall_s": round(wall_s, 3),
        "output_tok_s": round(out_tokens / wall_s, 2) if wall_s else 0.0,
        "latency_p50_s": round(pct(lat, 50), 4),
        "latency_p99_s": round(pct(lat, 99), 4),
        "ttft_p50_s": round(pct(ttft, 50), 4),
        "ttft_p99_s": round(pct(ttft, 99), 4),
    }


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def _measured(w: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A workload's runs that produced numbers (a run that failed carries only "error")."""
    return [r for r in w.get("runs", []) if "error" not in r]


def _single(runs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return next((r for r in runs if r["replicas"] == 1 and r["front_doors"] == 1), None)


def goals(workloads: Mapping[str, Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Issue 16's goals from the per-workload runs (`workloads[name]["runs"]`, each run with
    replicas, router, front_doors, config, hit_rate, max_over_mean; a failed run has "error"
    instead and is ignored). A goal whose baseline was not run is left out; `pass` is None
    where the ratio is undefined (a zero baseline)."""
    out: dict[str, list[dict[str, Any]]] = {
        "cache_aware_vs_single": [],
        "cache_aware_vs_round_robin_gsp": [],
        "uniform_max_over_mean": [],
        "skewed_max_over_mean": [],
    }
    for name in ("gsp", "chat", "few_shot"):
        runs = _measured(workloads.get(name, {}))
        single = _single(runs)
        for r in runs:
            if single is None or r["router"] != "cache_aware":
                continue
            ratio = _ratio(r["hit_rate"], single["hit_rate"])
            out["cache_aware_vs_single"].append(
                {
                    "workload": name,
                    "config": r["config"],
                    "ratio": ratio,
                    "pass": None if ratio is None else ratio >= HIT_VS_SINGLE,
                }
            )
    gsp_runs = _measured(workloads.get("gsp", {}))
    by_router = {
        r["router"]: r for r in gsp_runs if r["replicas"] == GSP_REPLICAS and r["front_doors"] == 1
    }
    if "cache_aware" in by_router and "round_robin" in by_router:
        ratio = _ratio(by_router["cache_aware"]["hit_rate"], by_router["round_robin"]["hit_rate"])
        out["cache_aware_vs_round_robin_gsp"].append(
            {
                "replicas": GSP_REPLICAS,
                "ratio": ratio,
                # round_robin at 0 % and cache_aware above it: infinitely better, a pass
                "pass": ratio >= HIT_VS_ROUND_ROBIN
                if ratio is not None
                else by_router["cache_aware"]["hit_rate"] > 0,
            }
        )
    for name, key, limit in (
        ("uniform", "uniform_max_over_mean", UNIFORM_LIMIT),
        ("skewed", "skewed_max_over_mean", SKEWED_LIMIT),
    ):
        for r in _measured(workloads.get(name, {})):
            if r["replicas"] > 1:
                out[key].append(
                    {
                        "config": r["config"],
                        "max_over_mean": r["max_over_mean"],
                        "limit": limit,
                        "pass": r["max_over_mean"] <= limit,
                    }
                )
    return out
