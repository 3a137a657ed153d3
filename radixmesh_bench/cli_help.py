"""`radixmesh bench cli`: how long the `radixmesh` command takes to answer `--help`, and which
heavy modules its process loads (none should: client commands import neither torch nor
xgrammar; the target is under 0.5 s on a warm machine).

Each run is a fresh interpreter, timed from spawn to exit. The command is the installed
`radixmesh` script where one is on PATH, else `python -m services.cli`. A separate probe
run of each command lists the heavy modules present in sys.modules at exit.

    radixmesh bench cli [--runs 10] [--out FILE]     # JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

HEAVY = ("torch", "xgrammar", "transformers", "numpy", "radixmesh_bench", "radixmesh.lang")
COMMANDS = (["--help"], ["generate", "--help"], ["serve", "--help"])

# Runs the CLI in-process, then reports which heavy modules it loaded (argparse's --help exits
# through SystemExit, so the report is written from an atexit hook).
_PROBE = (
    "import atexit, json, sys\n"
    "heavy = {heavy!r}\n"
    "atexit.register(lambda: sys.stderr.write('HEAVY=' + json.dumps(sorted("
    "m for m in heavy if m in sys.modules)) + '\\n'))\n"
    "from services.cli import main\n"
    "sys.exit(main({argv!r}))\n"
)


def _command() -> list[str]:
    script = shutil.which("radixmesh")
    return [script] if script else [sys.executable, "-m", "services.cli"]


def _time_runs(cmd: list[str], runs: int) -> dict[str, float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t0)
    return {
        "mean_s": round(statistics.fmean(times), 4),
        "p50_s": round(statistics.median(times), 4),
        "min_s": round(min(times), 4),
        "max_s": round(max(times), 4),
    }


def heavy_modules(argv: list[str]) -> list[str]:
    code = _PROBE.format(heavy=HEAVY, argv=argv)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    ).stderr
    line = next(x for x in out.splitlines() if x.startswith("HEAVY="))
    return list(json.loads(line.removeprefix("HEAVY=")))


def run(ns: argparse.Namespace) -> dict[str, Any]:
    base = _command()
    _time_runs([*base, "--help"], 1)  # warm the page cache and .pyc files
    results = []
    for argv in COMMANDS:
        results.append(
            {
                "command": " ".join(["radixmesh", *argv]),
                "runs": ns.runs,
                **_time_runs([*base, *argv], ns.runs),
                "heavy_modules_loaded": heavy_modules(list(argv)),
            }
        )
    return {
        "benchmark": "cli_help",
        "launcher": " ".join(base),
        "target_s": 0.5,
        "results": results,
    }


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("cli", help="time `radixmesh --help` and list heavy imports")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--out", default="", help="also write the JSON here")

    def main(ns: argparse.Namespace) -> int:
        from radixmesh_bench.report import emit_report

        return emit_report(run(ns), ns.out)

    p.set_defaults(func=main)
