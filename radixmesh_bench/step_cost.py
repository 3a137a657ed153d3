"""`radixmesh bench step-cost`: the stack's CPU cost per step, on the CPU (JSON on stdout).

Two parts, both deterministic enough to catch a regression in a number (issue 27):

- `scheduler` (step_cost_sched): the scheduler's own CPU per step at 64 and 256 running, with
  and without a waiting backlog, by phase (build, encode, decode, apply, flush), plus the bytes
  per step to the model service and to the front door.
- `codec` (step_codec_cost): the step codec at 1, 64 and 256 decode rows, decode-only and mixed
  with admissions: bytes per step message and result, and the encode/decode time of each side.
- `session` (step_cost_session): the model service's real step session (`Steps`) over a
  stand-in runner, two steps in flight: its own CPU per step at 1, 64 and 256 decode rows.

`--split FILE` reads a GPU `stack` result (results/gpu/*stack*.json) instead and splits each
through-the-stack row's wall time into the worker's GPU time, the GPU's idle time between
steps and the rest, which the worker's steps do not cover (docs/step-cost.md).

`--process` adds the scheduler as a process over gRPC against a fake model service and front
door (`tests/load/scheduler_load.py`, which must be importable: run from a checkout).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from radixmesh_bench.report import emit_report


def _process_part(running: list[int], seconds: float) -> dict[str, Any]:
    try:
        from tests.load.scheduler_load import load_one
    except ImportError as exc:  # an installed package without the repository's tests
        return {
            "skipped": f"tests/load/scheduler_load.py not importable ({exc}): run from a checkout"
        }
    log_dir = Path(tempfile.mkdtemp(prefix="step-cost-"))
    out: dict[str, Any] = {"logs": str(log_dir)}
    for n in running:
        out[f"running_{n}"] = asyncio.run(load_one(n, 1000, 128, seconds, False, log_dir, []))
    return out


def stack_split(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Per through-the-stack row of a `stack` result: its wall seconds as GPU busy + GPU idle
    between steps (`scheduler_steps` x the worker's per-step CUDA-event figures) + the rest,
    with the in-process row of the same workload for reference."""
    rows = doc.get("rows", [])
    inproc = {r["workload"]: r for r in rows if str(r.get("path", "")).startswith("in-process")}
    out = []
    for r in rows:
        if r.get("path") != "grpc-stack" or r.get("gpu_busy_ms_per_step") is None:
            continue
        steps = r["scheduler_steps"]
        busy = steps * r["gpu_busy_ms_per_step"] / 1e3
        idle = steps * r["gpu_idle_ms_per_step"] / 1e3
        ref = inproc.get(r["workload"], {})
        out.append(
            {
                "workload": r["workload"],
                "overlap": r.get("overlap", ""),
                "tok_s": round(r["tok_s"]),
                "in_process_tok_s": round(ref["tok_s"]) if "tok_s" in ref else None,
                "wall_s": round(r["wall_s"], 3),
                "gpu_busy_s": round(busy, 3),
                "gpu_idle_between_steps_s": round(idle, 3),
                "rest_s": round(r["wall_s"] - busy - idle, 3),
            }
        )
    return out


def run(ns: argparse.Namespace) -> dict[str, Any]:
    from radixmesh_bench.step_codec_cost import run_codec
    from radixmesh_bench.step_cost_sched import run_scheduler
    from services.logging import configure_logging

    if ns.split:
        doc = json.loads(Path(ns.split).read_text())
        return {"bench": "step_cost_split", "source": ns.split, "rows": stack_split(doc)}
    # the scheduler's per-request debug lines are not the cost
    configure_logging("bench", "warning")
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "bench": "step_cost",
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "note": "scheduler: thread CPU; codec: wall, best median; session: process CPU; "
        "best of --repeats (noise on a shared box only adds)",
    }
    if "scheduler" in ns.parts:
        report["scheduler"] = run_scheduler(
            ns.running, ns.waiting, ns.steps, ns.warmup_steps, ns.repeats
        )
    if "codec" in ns.parts:
        report["codec"] = run_codec(ns.rows, ns.codec_iters, ns.repeats)
    if "session" in ns.parts:
        from radixmesh_bench.step_cost_session import run_session

        report["session"] = run_session(ns.rows, ns.session_steps, ns.repeats)
    if ns.process:
        report["process"] = _process_part(ns.running, ns.process_seconds)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    return report


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "step-cost", help="scheduler CPU per step and the step codec's bytes and time (CPU)"
    )
    p.add_argument("--parts", nargs="+", default=["scheduler", "codec", "session"])
    p.add_argument("--running", type=int, nargs="+", default=[64, 256])
    p.add_argument("--waiting", type=int, default=1000, help="also measured: a queued backlog")
    p.add_argument("--steps", type=int, default=400, help="measured steps per run")
    p.add_argument("--warmup-steps", type=int, default=40, help="admission, before measuring")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 64, 256], help="codec: rows")
    p.add_argument("--codec-iters", type=int, default=300)
    p.add_argument("--session-steps", type=int, default=400, help="session: measured steps")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--process", action="store_true", help="also the scheduler process over gRPC")
    p.add_argument("--process-seconds", type=float, default=6.0)
    p.add_argument("--split", default="", help="split a GPU stack result's wall time instead")
    p.add_argument("--out", default="", help="also write the JSON here")

    def main(ns: argparse.Namespace) -> int:
        return emit_report(run(ns), ns.out)

    p.set_defaults(func=main)
