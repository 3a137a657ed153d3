"""Run one serving benchmark's requests from several client processes.

One Python process parsing thousands of streams (SSE JSON or gRPC messages) can become the
bottleneck of the measurement itself; dealing the requests round-robin to N spawned processes,
which start together behind a barrier, keeps the load generator out of the way. Outcomes come
back in the original request order; the run's wall time spans the earliest start to the
latest end (time.perf_counter is system-wide on Linux).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
from typing import Any

from radixmesh_bench.serving_clients import Out, RunSpec, drive

PART_TIMEOUT_S = 6 * 3600.0


def _part(k: int, barrier: Any, results: Any, spec: RunSpec) -> None:
    outs, t0, t1 = asyncio.run(drive(spec, barrier))
    results.put((k, outs, t0, t1))


def spread(procs: int, spec: RunSpec) -> tuple[list[Out], float]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    results = ctx.Queue()
    workers = [
        ctx.Process(target=_part, args=(k, barrier, results, spec.share(k, procs)), daemon=True)
        for k in range(procs)
    ]
    for w in workers:
        w.start()
    parts: dict[int, tuple[list[Out], float, float]] = {}
    try:
        while len(parts) < procs:
            try:
                k, outs, t0, t1 = results.get(timeout=5.0)
            except queue.Empty:
                dead = [w for w in workers if w.exitcode not in (None, 0)]
                if dead:
                    code = dead[0].exitcode
                    raise RuntimeError(f"a client process died (exit code {code})") from None
                continue
            parts[k] = (outs, t0, t1)
    finally:
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.kill()
    merged: list[Out] = [Out()] * len(spec.reqs)
    for k, (outs, _, _) in parts.items():
        merged[k::procs] = outs
    wall = max(p[2] for p in parts.values()) - min(p[1] for p in parts.values())
    return merged, wall
