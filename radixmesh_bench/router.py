"""`radixmesh bench router`: cache-aware routing over N replicas against one replica and the
simpler policies (issue 16's measurement). JSON on stdout (and `--out`), progress on stderr.

For each workload (router_workloads) and configuration (router_stack.configurations): start a
fresh local topology with the workload's total KV split over its replicas, warm it, scrape
every scheduler's /metrics, run the workload through the public gRPC API, scrape again, stop.
Per run: hit rate from the responses, requests per replica from the schedulers' counters and
their max/mean, output tok/s, latency and TTFT p50/p99; then issue 16's goal ratios
(router_report.goals). How to read it: docs/bench_router.md.

    radixmesh bench router --scale small --replicas 1,2 --routers cache_aware,round_robin
    radixmesh bench router --random-weights llama-3.2-1b --device cuda --replicas 2 \\
        --kv-tokens 200000 --workloads gsp --scale large        # two replicas on one GPU
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from radixmesh_bench.prom_text import Samples
from radixmesh_bench.radix_workloads import Workload, optimal_hit_rate, unique_tokens
from radixmesh_bench.report import emit_report
from radixmesh_bench.router_report import FINISHED, counter_deltas, goals, summarize_run
from radixmesh_bench.router_stack import (
    ROUTERS,
    RouterConfig,
    RunningTopology,
    configurations,
    per_replica_kv,
    start_topology,
)
from radixmesh_bench.router_workloads import SCALES, WORKLOADS, Sizes, build, sizes_for
from radixmesh_bench.stack import add_model_flags, model_source, progress

KV_SLACK = 64  # per replica beyond the longest request: room for the scheduler to admit it
SETTLE_S = 10.0  # how long the schedulers' counters may lag the last response


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _model(ns: argparse.Namespace) -> tuple[str, list[str]]:
    """The model folder and the model services' flags, without --kv-tokens (split per run):
    the given model, or random weights of a published shape on `--device` (GPU runs)."""
    folder, args = model_source(ns.model, ns.random_weights, ns.device)
    return folder, [*args, *ns.model_arg]


def kv_total(w: Workload, fraction: float, max_replicas: int, given: int) -> int:
    """The workload's total KV pool: `given` if set, else `fraction` of its unique tokens
    (prompts + planned outputs). Never below what lets the largest replica count admit the
    longest request on every replica."""
    prompts, full = w.planned()
    floor = max_replicas * (max(len(f) for f in full) + KV_SLACK)
    if given:
        if given < floor:
            raise ValueError(
                f"--kv-tokens {given} is too small for {w.name}: {max_replicas} replicas "
                f"need at least {floor} in all to admit its longest request"
            )
        return given
    return max(math.ceil(unique_tokens(full) * fraction), floor)


def _settled(topo: RunningTopology, base: Mapping[str, Samples], n: int) -> dict[str, Samples]:
    """Scrape until the schedulers have counted `n` more requests as finished than in `base`
    (their counters may trail the last response by a step), or SETTLE_S passes."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        now = topo.scrape_schedulers()
        done = sum(counter_deltas(base, now, FINISHED).values())
        if done >= n or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def run_one(
    cfg: RouterConfig,
    w: Workload,
    ns: argparse.Namespace,
    model: tuple[str, list[str]],
    kv: int,
    logs: Path,
) -> dict[str, Any]:
    from radixmesh_bench.router_drive import drive, wait_all_serving, warm_up

    tag = cfg.label.replace(" ", "_").replace(",", "")
    with start_topology(
        cfg,
        model[0],
        model[1],
        kv,
        ns.sched_arg,
        logs / w.name / tag,
        ns.startup_timeout,
        front_door_args=ns.front_door_arg,
    ) as topo:
        zero: dict[str, Samples] = {name: {} for name in topo.scheduler_metrics}
        if cfg.replicas > 1:
            wait_all_serving(topo.endpoints, cfg.replicas)
        before = _settled(topo, zero, warm_up(topo.endpoints, cfg.replicas))
        routed_before = topo.scrape_front_doors()
        outcomes, wall = drive(topo.endpoints, w, ns.concurrency)
        after = _settled(topo, before, sum(1 for o in outcomes if not o.error))
        routed_after = topo.scrape_front_doors()
    summary = summarize_run(outcomes, wall, before, after, routed_before, routed_after)
    return {**_describe(cfg, kv), **summary}


def _describe(cfg: RouterConfig, kv: int) -> dict[str, Any]:
    return {
        "config": cfg.label,
        "replicas": cfg.replicas,
        "router": cfg.router,
        "front_doors": cfg.front_doors,
        "kv_tokens_per_replica": per_replica_kv(kv, cfg.replicas),
    }


def run(ns: argparse.Namespace) -> dict[str, Any]:
    from services.logging import configure_logging

    configure_logging("bench", "warning")  # stdout carries only the JSON report
    overrides = {f.name: getattr(ns, f.name) for f in fields(Sizes)}
    sizes = sizes_for(ns.scale, **overrides)
    workloads = build(_csv(ns.workloads), sizes, ns.seed)
    replicas = [int(x) for x in _csv(ns.replicas)]
    fd_replicas = ns.front_door_replicas or max([2, *replicas])
    configs = configurations(replicas, _csv(ns.routers), ns.front_doors, fd_replicas)
    max_replicas = max(c.replicas for c in configs)
    model = _model(ns)
    logs = Path(ns.log_dir or tempfile.mkdtemp(prefix="radixmesh-bench-router-"))
    progress(f"{len(workloads)} workloads x {len(configs)} configurations; logs in {logs}")
    report: dict[str, Any] = {
        "bench": "router",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "model": ns.random_weights or ns.model,
        "device": ns.device if ns.random_weights else "cpu",
        "settings": {
            "scale": ns.scale,
            "sizes": asdict(sizes),
            "seed": ns.seed,
            "concurrency": ns.concurrency,
            "kv_fraction": ns.kv_fraction,
            "scheduler_args": ns.sched_arg,
            "front_door_args": ns.front_door_arg,
            "model_args": model[1],
        },
        "workloads": {},
    }
    t_all = time.perf_counter()
    for w in workloads:
        prompts, full = w.planned()
        kv = kv_total(w, ns.kv_fraction, max_replicas, ns.kv_tokens)
        plan = optimal_hit_rate(prompts, [f[:-1] for f in full])
        entry: dict[str, Any] = {
            "requests": len(prompts),
            "prompt_tokens": plan["prompt_tokens"],
            "unique_tokens": unique_tokens(full),
            "kv_tokens_total": kv,
            "optimal_hit_rate_planned": round(plan["optimal_hit_rate"], 4),
            "runs": [],
        }
        progress(
            f"{w.name}: {len(prompts)} requests, {plan['prompt_tokens']} prompt tokens, "
            f"KV {kv} tokens in all, optimal hit rate {plan['optimal_hit_rate']:.3f}"
        )
        for cfg in configs:
            progress(f"  {w.name}: {cfg.label} ...")
            try:
                r = run_one(cfg, w, ns, model, kv, logs)
            except (RuntimeError, TimeoutError, OSError, KeyError) as exc:
                # A configuration that cannot start (e.g. a front door without multi-replica
                # support) or be measured is reported and skipped; the others still run.
                progress(f"    FAILED: {exc}")
                entry["runs"].append({**_describe(cfg, kv), "error": str(exc)})
                continue
            progress(
                f"    hit {r['hit_rate']:.3f}, per replica {r['requests_per_replica']} "
                f"(max/mean {r['max_over_mean']}), {r['output_tok_s']} tok/s, "
                f"p50 {r['latency_p50_s']} s, errors {r['errors']}, routed {r['route_reasons']}, "
                f"evicted {r['evicted_tokens_per_replica']}"
            )
            entry["runs"].append(r)
        report["workloads"][w.name] = entry
    report["goals"] = goals(report["workloads"])
    report["total_s"] = round(time.perf_counter() - t_all, 1)
    report["logs"] = str(logs)
    return report


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "router",
        help="cache-aware routing over 1/2/4 replicas vs round_robin/least_load (issue 16)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--replicas", default="1,2,4", help="replica counts, comma list (1: baseline)")
    p.add_argument(
        "--routers", default=",".join(ROUTERS), help="front-door --router policies, comma list"
    )
    p.add_argument(
        "--front-doors",
        type=int,
        default=2,
        help="also run cache_aware behind this many front doors, clients spread over them "
        "(0 or 1: skip)",
    )
    p.add_argument(
        "--front-door-replicas",
        type=int,
        default=0,
        help="replicas of the several-front-door run (0: the largest of --replicas, at least 2)",
    )
    p.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}"
    )
    p.add_argument("--scale", default="medium", choices=list(SCALES), help="workload size preset")
    sizes = p.add_argument_group("workload sizes (override the --scale preset)")
    for f in fields(Sizes):
        flag = "--" + f.name.replace("_", "-")
        kind = float if f.type in (float, "float") else int
        presets = ", ".join(f"{k} {getattr(v, f.name)}" for k, v in SCALES.items())
        sizes.add_argument(flag, type=kind, default=None, dest=f.name, help=presets)
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--concurrency", type=int, default=16, help="most requests in flight")
    add_model_flags(
        p,
        kv_help="TOTAL KV pool of every configuration, split evenly over its replicas "
        "(0: --kv-fraction of each workload's unique tokens)",
    )
    p.add_argument(
        "--kv-fraction",
        type=float,
        default=1.0,
        help="with --kv-tokens 0: total KV as a fraction of the workload's unique tokens",
    )
    p.add_argument("--model", default="default", help="model folder or 'default' (SmolLM2-135M)")
    p.add_argument(
        "--model-arg",
        action="append",
        default=[],
        help="extra model service flag, as --model-arg=--flag=value (repeatable)",
    )
    p.add_argument(
        "--sched-arg",
        action="append",
        default=[],
        help="extra scheduler flag, as --sched-arg=--flag=value (repeatable)",
    )
    p.add_argument(
        "--front-door-arg",
        action="append",
        default=[],
        help="extra front-door flag for every run, as --front-door-arg=--balance-rel=2 "
        "(repeatable; ablations of the router's settings)",
    )
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds per topology")
    p.add_argument("--log-dir", default="", help="service logs (default: a fresh temp folder)")
    p.add_argument("--out", default="", help="also write the JSON here")

    def main(ns: argparse.Namespace) -> int:
        report = run(ns)
        emit_report(report, ns.out)
        failed = [r for w in report["workloads"].values() for r in w["runs"] if "error" in r]
        return 1 if failed else 0

    p.set_defaults(func=main)
