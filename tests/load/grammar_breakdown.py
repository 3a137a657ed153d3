"""Where one constrained decode step's mask time goes, stage by stage (issue 5).

The path of a batch-N mask step, grammar service -> scheduler -> model service, each stage
timed with perf_counter on the same workload (the GPU benchmark's JSON schemas,
radixmesh_bench/gpu/constrained_schemas.py, under the real Llama-3.1 tokenizer, 128,256-wide masks):

  sched_build     scheduler: pack the MaskStep (accepts, wanted rows) and serialize it
  grammar_parse   grammar: MaskStep from bytes, `parse_step`
  accept          grammar: releases, binds, one accept_token per row
  fill            grammar: fill_next_token_bitmask for every row (xgrammar, threaded batch)
  encode          grammar: bitmask -> each row's wire form, can_end, MaskRow messages
  jump_forward    grammar: jump-forward proposals (only with --jump-forward)
  result_ser      grammar: MaskStepResult to bytes (gRPC does it after service_ms ends)
  result_parse    scheduler: MaskStepResult from bytes
  relay           scheduler: `StepMasks.after_send`'s row loop, the StepMasks, its bytes
  model_decode    model: StepMasks from bytes, the mailbox dict, `allowed_on_device`
                  (host work plus the device copy and kernels; CUDA is synchronized)
  grpc_transport  measured apart: gRPC round trip to the service in a subprocess minus its
                  service_ms and the four (de)serializations above (the event loops, HTTP/2,
                  the socket). The scheduler -> model hop of StepMasks is one more like it.

The stages run one after another in this process except grpc_transport, so their sum is the
critical path a decode row waits for between its token and its sampling (with one more hop).

    python tests/load/grammar_breakdown.py [--batches 1,16,64] [--steps 200] [--jump-forward]
        [--fill-threads 0] [--device auto|cpu|cuda] [--json]

Equivalent: `python tests/load/grammar_load.py --breakdown [same flags]`.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

import grpc  # noqa: E402
import torch  # noqa: E402

from grammar_service.compile_cache import GrammarKind  # noqa: E402
from grammar_service.config import GrammarConfig  # noqa: E402
from grammar_service.server import GrammarServicer, build_servicer  # noqa: E402
from grammar_service.steps import parse_step  # noqa: E402
from grammar_service.suite import GrammarCase  # noqa: E402
from model_service.mask_device import allowed_on_device  # noqa: E402
from radixmesh_bench.gpu.constrained_schemas import SCHEMA_TEXT  # noqa: E402
from radixmesh_wire.mask_rows import EncodedRow  # noqa: E402
from radixmesh_wire.mask_step import MaskStepBuilder, decode_mask_result, grammar_spec  # noqa: E402
from radixmesh_wire.pb import grammar_pb2 as pb  # noqa: E402
from radixmesh_wire.pb import grammar_pb2_grpc as pb_grpc  # noqa: E402
from radixmesh_wire.pb import model_pb2  # noqa: E402
from radixmesh_wire.step_codec import decode_masks, encode_masks  # noqa: E402
from radixmesh_wire.step_ops import LateMasks  # noqa: E402
from services.logging import configure_logging  # noqa: E402
from tests.load.grammar_load import Trace, Workload, make_traces, serve_forever  # noqa: E402

STAGES = (
    "sched_build",
    "grammar_parse",
    "accept",
    "fill",
    "encode",
    "jump_forward",
    "result_ser",
    "result_parse",
    "relay",
    "model_decode",
)
WARMUP = 10


def gpu_cases() -> list[GrammarCase]:
    """The GPU benchmark's schemas as load-test cases (bounded: every walk ends by itself)."""
    return [
        GrammarCase(name, GrammarKind.JSON_SCHEMA, text, (), (), bounded=True)
        for name, text in SCHEMA_TEXT.items()
    ]


def llama_tokenizer_dir() -> str:
    from model_service.random_configs import bundled_tokenizer_dir

    return os.environ.get("GRAMMAR_LOAD_TOKENIZER") or str(bundled_tokenizer_dir())


def relay(res: pb.MaskStepResult, step_id: int, jump: bool) -> bytes:
    """The scheduler's share: the grammar link decodes the result, `StepMasks.after_send` keeps
    each row that has no jump-forward tokens, and the model link encodes the `LateMasks` for
    the model service, which gRPC serializes."""
    out = decode_mask_result(res, jumps_asked=jump)
    rows: dict[int, EncodedRow] = {}
    skip: set[int] = set()
    for h, row in out.rows.items():
        if h in out.jumps:
            skip.add(h)
        else:
            rows[h] = row
    return encode_masks(LateMasks(step_id, rows, sorted(skip))).SerializeToString()


def model_decode(data: bytes, vocab_size: int, device: torch.device) -> None:
    """The model service's share: parse, the mailbox's decode, `step_logits.apply_masks`'s rows
    and `allowed_on_device` (synchronized, so device work is counted)."""
    late = decode_masks(model_pb2.StepMasks.FromString(data))
    set(late.skip)
    rows = list(late.rows.values())
    if rows:
        allowed_on_device(rows, vocab_size, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Adds the seconds between `lap` calls to named stages."""

    def __init__(self, stages: dict[str, float]) -> None:
        self.stages = stages
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.stages[name] = self.stages.get(name, 0.0) + now - self.t
        self.t = now


def run_inproc(
    svc: GrammarServicer,
    traces: list[Trace],
    batch: int,
    steps: int,
    jump_forward: bool,
    device: torch.device,
) -> dict[str, Any]:
    """Every stage but the transport, one after another, per step."""
    state = svc.new_session(f"breakdown-{batch}")
    work = Workload(traces, batch, jump_forward)
    per_step: list[dict[str, float]] = []
    bytes_out = 0
    for i in range(steps):
        b = MaskStepBuilder()
        work.next_step(b)
        st: dict[str, float] = {}
        c = Clock(st)
        req = b.build(i).SerializeToString()
        c.lap("sched_build")
        ops = parse_step(pb.MaskStep.FromString(req))
        compiled = asyncio.run(svc._compile_binds(ops)) if ops.binds else {}
        c.lap("grammar_parse")
        res = svc.engine.run(state, ops, compiled, st)
        c.t = time.perf_counter()
        data = res.SerializeToString()
        c.lap("result_ser")
        got = pb.MaskStepResult.FromString(data)
        c.lap("result_parse")
        assert not got.errors, got.errors[0]
        masks = relay(got, i, jump_forward)
        c.lap("relay")
        model_decode(masks, svc.engine.vocab_size, device)
        c.lap("model_decode")
        if i >= WARMUP:
            per_step.append(st)
            bytes_out += len(data)
    out: dict[str, Any] = {k: _stat([s.get(k, 0.0) for s in per_step]) for k in STAGES}
    out["total"] = _stat([sum(s.values()) for s in per_step])
    out["result_bytes_per_row"] = round(bytes_out / (len(per_step) * batch), 1)
    out["serdes_mean_ms"] = round(
        sum(out[k]["mean_ms"] for k in ("sched_build", "grammar_parse", "result_ser"))
        + out["result_parse"]["mean_ms"],
        4,
    )
    return out


async def run_grpc(
    port: int, traces: list[Trace], batch: int, steps: int, jump_forward: bool
) -> dict[str, Any]:
    """Round trip through a real Masks stream, and the part of it outside service_ms."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GrammarStub(channel)
        for key in {(t.case.kind.value, t.case.text) for t in traces}:
            assert (await stub.Compile(pb.CompileRequest(grammar=grammar_spec(*key)))).ok
        call = stub.Masks()
        await call.write(pb.MaskRequest(open=pb.OpenMasks(session_id=f"breakdown-{batch}")))
        await call.read()
        work = Workload(traces, batch, jump_forward)
        rtt: list[float] = []
        outside: list[float] = []
        for i in range(steps):
            b = MaskStepBuilder()
            work.next_step(b)
            msg = b.build(i)
            t0 = time.perf_counter()
            await call.write(pb.MaskRequest(step=msg))
            res = (await call.read()).result
            dt = time.perf_counter() - t0
            if i >= WARMUP:
                rtt.append(dt)
                outside.append(dt - res.service_ms / 1e3)
        await call.done_writing()
    return {"round_trip": _stat(rtt), "outside_service": _stat(outside)}


def _stat(xs: list[float]) -> dict[str, float]:
    ms = sorted(x * 1e3 for x in xs)
    return {
        "mean_ms": round(statistics.fmean(ms), 4),
        "p50_ms": round(statistics.median(ms), 4),
        "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 4),
    }


def _table(report: dict[str, Any]) -> str:
    batches = report["batches"]
    head = f"{'stage (mean ms / p50)':<22}" + "".join(
        f"{'b=' + str(b['batch']):>18}" for b in batches
    )
    lines = [head]

    def inproc(stage: str) -> Callable[[dict[str, Any]], dict[str, float]]:
        return lambda b: dict(b["inproc"][stage])

    keys = [(k, inproc(k)) for k in (*STAGES, "total")]
    keys.append(("grpc_transport", lambda b: dict(b["grpc_transport"])))
    keys.append(("grpc_round_trip", lambda b: dict(b["grpc"]["round_trip"])))
    for name, get in keys:
        cells = "".join(f"{get(b)['mean_ms']:>10.3f} /{get(b)['p50_ms']:>6.3f}" for b in batches)
        lines.append(f"{name:<22}{cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--jump-forward", action="store_true", help="ask every row for a jump")
    ap.add_argument("--fill-threads", type=int, default=0, help="0: the service's default")
    ap.add_argument("--mask-threads", type=int, default=2)
    ap.add_argument("--device", default="auto", help="auto (cuda if present), cpu or cuda")
    ap.add_argument("--json", action="store_true", help="print the JSON report only")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    configure_logging("grammar-breakdown", "warning")
    tokenizer = llama_tokenizer_dir()
    config = GrammarConfig(mask_threads=ns.mask_threads, fill_threads=ns.fill_threads)
    if ns.serve:
        asyncio.run(serve_forever(tokenizer, config))
        return 0
    dev = ns.device if ns.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(dev)
    args = ["--mask-threads", str(ns.mask_threads), "--fill-threads", str(ns.fill_threads)]
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        svc = build_servicer(tokenizer, config)
        traces = make_traces(svc, per_case=4, max_len=128, seed=0, cases=gpu_cases())
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        report: dict[str, Any] = {
            "cpu_count": os.cpu_count(),
            "vocab_size": svc.engine.vocab_size,
            "fill_threads": svc.engine.fill_threads,
            "device": str(device),
            "jump_forward": ns.jump_forward,
            "steps": ns.steps,
            "mean_trace_tokens": round(statistics.fmean(len(t.tokens) for t in traces), 1),
            "batches": [],
        }
        for batch in (int(x) for x in ns.batches.split(",")):
            inproc = run_inproc(svc, traces, batch, ns.steps, ns.jump_forward, device)
            remote = asyncio.run(run_grpc(port, traces, batch, ns.steps, ns.jump_forward))
            # what the round trip adds beyond the engine: minus the (de)serializations
            # measured in-process, the rest is the event loops, HTTP/2 and the socket
            transport = {
                k: round(max(0.0, remote["outside_service"][k] - inproc["serdes_mean_ms"]), 4)
                for k in ("mean_ms", "p50_ms", "p99_ms")
            }
            report["batches"].append(
                {"batch": batch, "inproc": inproc, "grpc": remote, "grpc_transport": transport}
            )
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=30)
    if ns.json:
        print(json.dumps(report, indent=2))
    else:
        print(json.dumps({k: v for k, v in report.items() if k != "batches"}))
        print(_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
