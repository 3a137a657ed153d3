"""Grammar replicas under load (issue 16): one scheduler's mask path with 1 vs 2 grammar
services at batch 64, JSON-schema and regex rows. `python tests/load/grammar_load.py
--replicas [--services 1,2] [--batch 64] [--steps 150] [--rounds 3] [--out FILE]
[--grammar-arg=--fill-threads=1 ...]`.

What runs: K real grammar services (`python -m grammar_service`, one process each, on free
ports) and, in this process, the scheduler's own `GrammarPool` over real `GrammarLink`s: the
exact code a scheduler step runs (`StepMasks._fetch` awaits `GrammarPool.step`). Each step
accepts one token per row (rows replay pre-generated random walks over the suite's JSON and
regex grammars; a finished row is released and its handle re-bound to the next walk, so binds
are placed on the least loaded service as they are in serving) and asks for all 64 masks.

Per step it records the wall time of `GrammarPool.step`, which is the scheduler's mask stall
(what `mask_wait_seconds` adds per step); masks/s is rows / mean stall. Service counts run in
interleaved rounds (1, 2, 1, 2, ...) in one invocation, so both see the same machine load. CPU
seconds of every grammar process and of this one are read from /proc per window, to tell
whether the services or the cores are the limit. Not part of CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from grammar_service.config import GrammarConfig  # noqa: E402
from grammar_service.kinds import GrammarKind  # noqa: E402
from grammar_service.server import build_servicer  # noqa: E402
from grammar_service.suite import SUITE  # noqa: E402
from scheduler_service.grammar.ops import GrammarOps  # noqa: E402
from scheduler_service.grammar.pool import GrammarPool  # noqa: E402
from scheduler_service.links.grammar import GrammarLink  # noqa: E402
from services.launcher import check_ready, free_port  # noqa: E402
from services.logging import configure_logging  # noqa: E402
from tests.load.grammar_load import Trace, _tokenizer_path, make_traces  # noqa: E402

KINDS = (GrammarKind.JSON_SCHEMA, GrammarKind.REGEX)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def grammar_services(n: int, log_dir: Path, extra: list[str]) -> Any:
    procs: list[tuple[subprocess.Popen[bytes], int]] = []
    try:
        for i in range(n):
            port = free_port()
            log = (log_dir / f"grammar-{i}.log").open("ab")
            cmd = [sys.executable, "-m", "grammar_service", "--port", str(port)]
            cmd += ["--log-level", "warning", *extra]
            proc = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=ROOT)
            procs.append((proc, port))
        deadline = time.monotonic() + 180
        for proc, port in procs:
            while not asyncio.run(check_ready(f"127.0.0.1:{port}")):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"grammar service on {port} did not start ({log_dir})")
                time.sleep(0.2)
        yield procs
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Rows:
    """`batch` rows replaying traces through the scheduler's GrammarOps."""

    def __init__(self, traces: list[Trace], batch: int, offset: int) -> None:
        self.traces, self.next = traces, offset
        self.ops = GrammarOps()
        self.rows: list[tuple[Trace, int]] = []
        for h in range(batch):
            t = self._take()
            self.ops.bind(h, t.case.kind.value, t.case.text)
            self.rows.append((t, 0))
        self.rebinds = 0

    def _take(self) -> Trace:
        t = self.traces[self.next % len(self.traces)]
        self.next += 1
        return t

    def advance(self) -> None:
        for h, (t, pos) in enumerate(self.rows):
            if pos >= len(t.tokens) - 1:  # the next token is EOS: finish and admit another
                self.ops.release(h)
                t, pos = self._take(), 0
                self.ops.bind(h, t.case.kind.value, t.case.text)
                self.rebinds += 1
            else:
                self.ops.accept(h, t.tokens[pos])
                pos += 1
            self.rows[h] = (t, pos)


async def measure(
    ports: list[int], pids: list[int], traces: list[Trace], batch: int, steps: int, rnd: int
) -> dict[str, Any]:
    pool = GrammarPool(",".join(f"127.0.0.1:{p}" for p in ports), GrammarLink)
    runner = asyncio.create_task(pool.run())
    try:
        deadline = time.monotonic() + 60
        while len(pool.connected()) < len(ports):
            assert time.monotonic() < deadline, "grammar links did not connect"
            await asyncio.sleep(0.05)
        keys = {(t.case.kind.value, t.case.text) for t in traces}
        for kind, text in keys:  # warm every service's cache, as submissions would
            for link in pool.links.values():
                ok, err = await link.compile(kind, text)
                assert ok, err
        rows = Rows(traces, batch, offset=rnd * batch)
        want = list(range(batch))
        stalls: list[float] = []
        c0 = [cpu_seconds(p) for p in pids]
        m0, w0 = time.process_time(), time.perf_counter()
        for i in range(steps):
            if i:
                rows.advance()
            plan = rows.ops.build(i, want)
            t0 = time.perf_counter()
            got = await pool.step(plan)
            stall = time.perf_counter() - t0
            assert not got.lost and not got.outcome.errors, (got.lost, got.outcome.errors[:1])
            assert len(got.outcome.rows) == batch
            if i >= 10:  # past the first binds
                stalls.append(stall)
        wall = time.perf_counter() - w0
        c1 = [cpu_seconds(p) for p in pids]
        m1 = time.process_time()
        ms = sorted(s * 1e3 for s in stalls)
        n = len(stalls)
        grammar_cpu = sum(c1) - sum(c0)
        return {
            "services": len(ports),
            "round": rnd,
            "masks_per_s": round(batch / (statistics.fmean(ms) / 1e3), 1),
            "stall_ms_per_step": {
                "mean": round(statistics.fmean(ms), 3),
                "p50": round(statistics.median(ms), 3),
                "p90": round(ms[int(0.9 * (n - 1))], 3),
                "p99": round(ms[int(0.99 * (n - 1))], 3),
            },
            "rows_per_service": dict(sorted(pool.rows_sent.items())),
            "rebinds": rows.rebinds,
            "grammar_cpu_s_per_step": round(grammar_cpu / steps, 5),
            "grammar_cpu_util": round(grammar_cpu / wall, 2),
            "driver_cpu_util": round((m1 - m0) / wall, 2),
            "window_s": round(wall, 2),
        }
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner


def run(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--services", default="1,2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="")
    ap.add_argument(
        "--grammar-arg",
        action="append",
        default=[],
        help="extra grammar service flag (repeatable), e.g. --grammar-arg=--fill-threads=1",
    )
    ns = ap.parse_args(argv)
    configure_logging("grammar-replicas", "warning")
    counts = [int(x) for x in ns.services.split(",")]
    svc = build_servicer(_tokenizer_path(), GrammarConfig())
    cases = [c for c in SUITE if c.kind in KINDS]
    traces = make_traces(svc, per_case=3, max_len=64, seed=0, cases=cases)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"grammar-replicas-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    runs: list[dict[str, Any]] = []
    with grammar_services(max(counts), log_dir, ns.grammar_arg) as procs:
        for rnd in range(ns.rounds):
            for k in counts:
                ports = [p for _, p in procs[:k]]
                pids = [proc.pid for proc, _ in procs[:k]]
                r = asyncio.run(measure(ports, pids, traces, ns.batch, ns.steps, rnd))
                print(json.dumps(r), file=sys.stderr, flush=True)
                runs.append(r)
    summary = {}
    for k in counts:
        mine = [r for r in runs if r["services"] == k]
        summary[str(k)] = {
            "masks_per_s_median": statistics.median(r["masks_per_s"] for r in mine),
            "stall_ms_per_step_median": statistics.median(
                r["stall_ms_per_step"]["mean"] for r in mine
            ),
            "stall_ms_p99_median": statistics.median(r["stall_ms_per_step"]["p99"] for r in mine),
            "grammar_cpu_util_median": statistics.median(r["grammar_cpu_util"] for r in mine),
        }
    report = {
        "test": "grammar_replicas",
        "what": "GrammarPool.step over real GrammarLinks to K real grammar services; "
        "stall = the scheduler's mask wait per step",
        "cpu_count": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load0],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "grammar_args": ns.grammar_arg,
        "batch": ns.batch,
        "steps": ns.steps,
        "kinds": [k.value for k in KINDS],
        "grammars": len({(t.case.kind, t.case.text) for t in traces}),
        "traces": len(traces),
        "mean_trace_tokens": round(statistics.fmean(len(t.tokens) for t in traces), 1),
        "summary": summary,
        "rounds": runs,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
