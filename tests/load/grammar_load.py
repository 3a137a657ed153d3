"""Grammar service load test: masks per second and step latency for batches of constrained rows,
through the gRPC service (a server subprocess on a free port) versus xgrammar called directly in
one process, plus the same step engine in-process (no transport) and cold compile times.

    python tests/load/grammar_load.py --json [--batches 1,16,64] [--steps 200]
    python tests/load/grammar_load.py --breakdown [...]  # per stage: grammar_breakdown.py
    python tests/load/grammar_load.py --replicas [...]   # 1 vs 2 services: grammar_replicas.py

Workload: every row replays a pre-generated random walk over a suite grammar (continuous
batching: a finished row is released and its handle re-bound to the next grammar in the same
step). Each step accepts one token per row and asks for every row's next-token mask, exactly
what the scheduler sends per decode step. Latency is write-step -> read-result; masks/s is
rows / mean step latency. Not part of CI timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import xgrammar as xgr  # noqa: E402

from grammar_service.config import GrammarConfig  # noqa: E402
from grammar_service.server import GrammarServicer, build_servicer, register  # noqa: E402
from grammar_service.suite import SUITE, GrammarCase  # noqa: E402
from grammar_service.tokenizer_source import default_tokenizer_dir  # noqa: E402
from radixmesh_wire.mask_step import MaskStepBuilder, grammar_spec  # noqa: E402
from radixmesh_wire.pb import grammar_pb2 as pb  # noqa: E402
from radixmesh_wire.pb import grammar_pb2_grpc as pb_grpc  # noqa: E402
from services.logging import configure_logging  # noqa: E402

CLOSERS = b'".}],'


@dataclass
class Trace:
    case: GrammarCase
    tokens: list[int]  # ends with a stop token


def make_traces(
    svc: GrammarServicer,
    per_case: int,
    max_len: int,
    seed: int,
    cases: Sequence[GrammarCase] = SUITE,
) -> list[Trace]:
    """Random walks with xgrammar directly: uniform over allowed tokens (closing punctuation
    favoured for unbounded grammars so rows finish and get re-bound)."""
    rng = np.random.default_rng(seed)
    vocab = svc.engine.vocab_size
    weight = np.array([8.0 if any(c in t for c in CLOSERS) else 1.0 for t in svc.token_bytes])
    stop = svc.engine.stop_token_ids
    bitmask = xgr.allocate_token_bitmask(1, vocab).numpy()
    traces = []
    for case in cases:
        # the service's own compile (its schema rewrites included), so every trace is valid
        grammar = asyncio.run(svc.cache.get(case.kind, case.text))[0]
        for _ in range(per_case):
            m, toks = xgr.GrammarMatcher(grammar), list[int]()
            while not m.is_terminated():
                m.fill_next_token_bitmask(bitmask)
                bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little", count=vocab)
                allowed = np.flatnonzero(bits)
                if len(toks) >= max_len and set(stop) & set(allowed.tolist()):
                    allowed = np.array(stop)
                w = weight[allowed] if not case.bounded else np.ones(len(allowed))
                t = int(rng.choice(allowed, p=w / w.sum()))
                assert m.accept_token(t)
                toks.append(t)
                if len(toks) > 4 * max_len:
                    break  # a grammar that never offers EOS: end the trace with a release
            traces.append(Trace(case, toks))
    return traces


class Workload:
    """Rows cycling through traces; `next_step` fills a builder with this step's operations."""

    def __init__(self, traces: list[Trace], batch: int, jump_forward: bool = False) -> None:
        self.traces, self.batch = traces, batch
        self.jump_forward = jump_forward  # ask every row for a jump-forward proposal
        self.next_trace = 0
        self.rows: list[tuple[Trace, int]] = [(self._take(), 0) for _ in range(batch)]
        self.first = True

    def _take(self) -> Trace:
        trace = self.traces[self.next_trace % len(self.traces)]
        self.next_trace += 1
        return trace

    def next_step(self, b: MaskStepBuilder) -> list[tuple[int, Trace, int]]:
        """Ops for one step; returns (handle, trace, position) of each row to fill."""
        todo = []
        for h, (trace, pos) in enumerate(self.rows):
            if self.first:
                b.bind(h, trace.case.kind.value, trace.case.text)
            elif pos >= len(trace.tokens) - 1:  # the next token is EOS: finish, re-bind
                b.release(h)
                trace, pos = self._take(), 0
                b.bind(h, trace.case.kind.value, trace.case.text)
            else:
                b.accept(h, [trace.tokens[pos]])
                pos += 1
            self.rows[h] = (trace, pos)
            b.want(h, jump_forward=self.jump_forward)
            todo.append((h, trace, pos))
        self.first = False
        return todo


def summarize(lat_s: list[float], batch: int) -> dict[str, float]:
    ms = sorted(x * 1e3 for x in lat_s)
    return {
        "p50_ms": round(statistics.median(ms), 4),
        "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 4),
        "mean_ms": round(statistics.fmean(ms), 4),
        "masks_per_s": round(batch / (statistics.fmean(ms) / 1e3), 1),
    }


def bench_direct(svc: GrammarServicer, traces: list[Trace], batch: int, steps: int) -> dict:
    """xgrammar alone: accept + fill per row (threaded batch fill where the service uses it)."""
    compiled = {}
    for t in traces:
        key = (t.case.kind, t.case.text)
        if key not in compiled:
            compiled[key] = asyncio.run(svc.cache.get(*key))[0]
    bitmask = xgr.allocate_token_bitmask(batch, svc.engine.vocab_size)
    batcher = xgr.BatchGrammarMatcher(max_threads=svc.config.mask_threads)
    work, lat = Workload(traces, batch), []
    matchers: dict[int, xgr.GrammarMatcher] = {}
    for i in range(steps):
        b = MaskStepBuilder()
        todo = work.next_step(b)
        t0 = time.perf_counter()
        for h, trace, pos in todo:
            if pos == 0:
                matchers[h] = xgr.GrammarMatcher(compiled[(trace.case.kind, trace.case.text)])
            else:
                matchers[h].accept_token(trace.tokens[pos - 1])
        if batch >= svc.engine.batch_fill_min_rows:
            batcher.batch_fill_next_token_bitmask([matchers[h] for h in range(batch)], bitmask)
        else:
            for h in range(batch):
                matchers[h].fill_next_token_bitmask(bitmask, h)
        if i >= 10:
            lat.append(time.perf_counter() - t0)
    return summarize(lat, batch)


async def bench_service(
    step_fn: Any, traces: list[Trace], batch: int, steps: int
) -> dict[str, Any]:
    work, lat, nbytes, forms = Workload(traces, batch), list[float](), 0, {1: 0, 2: 0, 3: 0}
    for i in range(steps):
        b = MaskStepBuilder()
        work.next_step(b)
        msg = b.build(i)
        t0 = time.perf_counter()
        result = await step_fn(msg)
        dt = time.perf_counter() - t0
        assert not result.errors, result.errors[0]
        if i >= 10:
            lat.append(dt)
            nbytes += result.ByteSize()
            for r in result.rows:
                forms[r.encoding] += 1
    out: dict[str, Any] = dict(summarize(lat, batch))
    out["reply_bytes_per_row"] = round(nbytes / (len(lat) * batch), 1)
    total = sum(forms.values())
    out["forms"] = {
        n: round(forms[v] / total, 3)
        for v, n in ((1, "bitmask"), (2, "allowed"), (3, "disallowed"))
    }
    return out


async def bench_grpc(port: int, traces: list[Trace], batch: int, steps: int) -> dict:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GrammarStub(channel)
        for key in {(t.case.kind.value, t.case.text) for t in traces}:  # warm, as at submission
            assert (await stub.Compile(pb.CompileRequest(grammar=grammar_spec(*key)))).ok
        call = stub.Masks()
        await call.write(pb.MaskRequest(open=pb.OpenMasks(session_id=f"load-{batch}")))
        await call.read()

        async def step(msg: pb.MaskStep) -> pb.MaskStepResult:
            await call.write(pb.MaskRequest(step=msg))
            return (await call.read()).result

        out = await bench_service(step, traces, batch, steps)
        await call.done_writing()
        return out


def cold_compiles(tokenizer: str) -> dict:
    """Every suite grammar compiled once with no cache anywhere (ours is empty, xgrammar's off)."""
    cold = build_servicer(tokenizer, GrammarConfig(disable_xgrammar_cache=True))
    times = []
    for case in SUITE:
        t0 = time.perf_counter()
        asyncio.run(cold.cache.get(case.kind, case.text))
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {
        "grammars": len(times),
        "p50_ms": round(statistics.median(times), 2),
        "max_ms": round(times[-1], 2),
        "total_ms": round(sum(times), 1),
    }


def _tokenizer_path() -> str:
    return os.environ.get("GRAMMAR_LOAD_TOKENIZER") or str(default_tokenizer_dir())


async def serve_forever(tokenizer: str, config: GrammarConfig) -> None:
    svc = build_servicer(tokenizer, config)
    server = grpc.aio.server()
    register(server, svc)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"PORT {port}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until parent exits
    await server.stop(None)


def main() -> int:
    if "--breakdown" in sys.argv:  # the per-stage mode lives in its own module
        from tests.load.grammar_breakdown import main as breakdown

        return breakdown([a for a in sys.argv[1:] if a != "--breakdown"])
    if "--replicas" in sys.argv:  # one scheduler's GrammarPool over 1 vs 2 grammar services
        from tests.load.grammar_replicas import run

        return run([a for a in sys.argv[1:] if a != "--replicas"])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--mask-threads", type=int, default=2)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    configure_logging("grammar-load", "warning")  # logs to stderr; stdout carries the report
    tokenizer = _tokenizer_path()
    if ns.serve:
        asyncio.run(serve_forever(tokenizer, GrammarConfig(mask_threads=ns.mask_threads)))
        return 0
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--mask-threads", str(ns.mask_threads)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        svc = build_servicer(tokenizer, GrammarConfig(mask_threads=ns.mask_threads))
        traces = make_traces(svc, per_case=3, max_len=96, seed=0)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(line.split()[1])
        report: dict[str, Any] = {
            "cpu_count": os.cpu_count(),
            "vocab_size": svc.engine.vocab_size,
            "steps": ns.steps,
            "traces": len(traces),
            "mean_trace_tokens": round(statistics.fmean(len(t.tokens) for t in traces), 1),
            "batches": [],
        }
        for batch in (int(x) for x in ns.batches.split(",")):
            direct = bench_direct(svc, traces, batch, ns.steps)
            state = svc.new_session("inproc")
            inproc = asyncio.run(
                bench_service(lambda m, s=state: svc.run_step(s, m), traces, batch, ns.steps)
            )
            remote = asyncio.run(bench_grpc(port, traces, batch, ns.steps))
            report["batches"].append(
                {
                    "batch": batch,
                    "direct_xgrammar": direct,
                    "service_inproc": inproc,
                    "grpc": remote,
                    "grpc_vs_direct": {
                        "p50_latency_ratio": round(remote["p50_ms"] / direct["p50_ms"], 2),
                        "masks_per_s_ratio": round(
                            remote["masks_per_s"] / direct["masks_per_s"], 3
                        ),
                    },
                }
            )
            if not ns.json:
                print(f"batch {batch}: direct {direct} | inproc {inproc} | grpc {remote}")
        report["cold_compile"] = cold_compiles(tokenizer)
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=30)
    print(json.dumps(report, indent=2) if ns.json else json.dumps(report["cold_compile"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
