"""`radixmesh bench ...` sub-commands (JSON results).

A plug-in of the `radixmesh` command, not a part of it: `services.cli` forwards
`radixmesh bench ARGS` to `python -m radixmesh_bench ARGS` without importing this package
(the benchmarks import torch and xgrammar, which no client command should pay for).
"""

from __future__ import annotations

import argparse
import sys


def add_bench_commands(b: argparse.ArgumentParser) -> None:
    bsub = b.add_subparsers(dest="bench", required=True)
    from radixmesh_bench import (
        cli_help,
        constrained,
        cpu_serving,
        dsl_ablation,
        online_serving,
        radix_bench,
        router,
        security_cost,
        step_cost,
    )

    cpu_serving.add_parser(bsub)
    radix_bench.add_parser(bsub)
    dsl_ablation.add_parser(bsub)
    constrained.add_parser(bsub)
    online_serving.add_parser(bsub)
    security_cost.add_parser(bsub)
    step_cost.add_parser(bsub)
    router.add_parser(bsub)
    cli_help.add_parser(bsub)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixmesh bench", description="benchmarks with JSON output")
    add_bench_commands(p)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    return int(ns.func(ns))


if __name__ == "__main__":
    sys.exit(main())
