"""`radixmesh bench ...` sub-commands (JSON results)."""

from __future__ import annotations

import argparse


def add_bench_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    b = sub.add_parser("bench", help="benchmarks with JSON output")
    bsub = b.add_subparsers(dest="bench", required=True)
    from radixmesh_bench import (
        constrained,
        cpu_serving,
        dsl_ablation,
        radix_workloads,
        security_cost,
    )

    cpu_serving.add_parser(bsub)
    radix_workloads.add_parser(bsub)
    dsl_ablation.add_parser(bsub)
    constrained.add_parser(bsub)
    security_cost.add_parser(bsub)
