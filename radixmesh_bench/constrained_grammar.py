"""`radixmesh bench constrained`, straight to the grammar service (constrained.py runs these):
(a) compile cost, first and cached, and the effect of grammar reuse on throughput; (b) the mask
stall measured from outside, replaying finished outputs through a Masks session of our own."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grammar_service.suite import GrammarCase
from radixmesh_bench.constrained_requests import (
    BenchStack,
    Outcome,
    constrained_request,
    run_batch,
)
from radixmesh_bench.stack import pct

# --- (a) compile cost ---------------------------------------------------------------------


async def compile_pass(address: str, cases: Sequence[GrammarCase]) -> dict[str, dict[str, Any]]:
    """One Compile RPC per case, one at a time, straight to the grammar service."""
    import grpc

    from radixmesh_wire.mask_step import grammar_spec
    from radixmesh_wire.pb import grammar_pb2, grammar_pb2_grpc

    out: dict[str, dict[str, Any]] = {}
    async with grpc.aio.insecure_channel(address) as chan:
        stub = grammar_pb2_grpc.GrammarStub(chan)
        for case in cases:
            req = grammar_pb2.CompileRequest(grammar=grammar_spec(case.kind.value, case.text))
            t0 = time.perf_counter()
            reply = await stub.Compile(req, timeout=300)
            out[case.name] = {
                "kind": case.kind.value,
                "ok": reply.ok,
                "cached": reply.cached,
                "server_ms": round(reply.compile_ms, 3),
                "client_ms": round((time.perf_counter() - t0) * 1e3, 3),
            }
    return out


def compile_summary(per: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ms = [v["server_ms"] for v in per.values()]
    rtt = [v["client_ms"] for v in per.values()]
    slowest = max(per, key=lambda k: per[k]["server_ms"])
    return {
        "grammars": len(per),
        "all_ok": all(v["ok"] for v in per.values()),
        "cached_replies": sum(bool(v["cached"]) for v in per.values()),
        "server_ms_median": round(statistics.median(ms), 3),
        "server_ms_p90": round(pct(ms, 90), 3),
        "server_ms_max": round(max(ms), 3),
        "server_ms_total": round(sum(ms), 3),
        "slowest": slowest,
        "client_rtt_ms_median": round(statistics.median(rtt), 3),
    }


def variant_schema(case: GrammarCase, tag: str) -> str:
    """The same schema under another cache key (a description changes no accepted string)."""
    schema = json.loads(case.text)
    schema["description"] = f"bench variant {tag}"
    return json.dumps(schema)


def reuse_round(st: BenchStack, case: GrammarCase, n: int, timeout: float) -> dict[str, Any]:
    nonce = uuid.uuid4().hex[:10]
    same = variant_schema(case, f"{nonce}-shared")
    base = constrained_request(case, constrained=False)
    runs: dict[str, Any] = {}
    for label, schemas in (
        ("same_schema", [same] * n),
        ("distinct_schemas", [variant_schema(case, f"{nonce}-{i}") for i in range(n)]),
    ):
        summary, _ = run_batch(st, [dict(base, json_schema=s) for s in schemas], n, timeout)
        runs[label] = summary
    return runs


# --- (b) mask stall from outside ----------------------------------------------------------


@dataclass
class ReplayRow:
    kind: str
    text: str
    tokens: list[int]
    stopped: bool  # finished on EOS: one more mask (the one EOS was sampled under)

    @property
    def masks(self) -> int:
        return len(self.tokens) + (1 if self.stopped else 0)


async def mask_replay(address: str, rows: Sequence[ReplayRow]) -> dict[str, Any]:
    """Replay finished requests as the scheduler drives them, all starting together: step k
    accepts every active row's token k-1 and wants its next mask. Times each round trip."""
    import grpc

    from radixmesh_wire.mask_step import MaskStepBuilder
    from radixmesh_wire.pb import grammar_pb2, grammar_pb2_grpc

    queue: asyncio.Queue[grammar_pb2.MaskRequest | None] = asyncio.Queue()

    async def requests():  # type: ignore[no-untyped-def]
        yield grammar_pb2.MaskRequest(open=grammar_pb2.OpenMasks(session_id="bench-replay"))
        while (msg := await queue.get()) is not None:
            yield msg

    rtts: list[float] = []
    service: list[float] = []
    widths: list[int] = []
    errors = 0
    encodings: dict[str, int] = {}
    row_bytes = 0
    async with grpc.aio.insecure_channel(address) as chan:
        call = grammar_pb2_grpc.GrammarStub(chan).Masks(requests())
        await call.read()  # opened
        b = MaskStepBuilder()
        for h, r in enumerate(rows):
            b.bind(h, r.kind, r.text)
        step = 0
        while True:
            active = [h for h, r in enumerate(rows) if step < r.masks]
            for h, r in enumerate(rows):
                if step and step < r.masks:  # the token sampled under the previous mask
                    b.accept(h, [r.tokens[step - 1]])
                elif step and step == r.masks:  # finished at the previous step
                    b.release(h)
            if not active:
                break
            for h in active:
                b.want(h)
            t0 = time.perf_counter()
            queue.put_nowait(grammar_pb2.MaskRequest(step=b.build(step + 1)))
            reply = await call.read()
            rtts.append((time.perf_counter() - t0) * 1e3)
            service.append(reply.result.service_ms)
            widths.append(len(active))
            errors += len(reply.result.errors)
            for row in reply.result.rows:
                name = grammar_pb2.MaskEncoding.Name(row.encoding).removeprefix("MASK_ENCODING_")
                encodings[name] = encodings.get(name, 0) + 1
                row_bytes += len(row.data)
            step += 1
        queue.put_nowait(None)
        call.cancel()
    later = rtts[1:] or rtts  # step 1 also binds every row
    return {
        "rows": len(rows),
        "steps": len(rtts),
        "row_errors": errors,
        "rows_per_step_mean": round(statistics.mean(widths), 2) if widths else 0,
        "first_step_ms": round(rtts[0], 3) if rtts else 0.0,
        "rtt_ms_mean": round(statistics.mean(later), 3) if later else 0.0,
        "rtt_ms_p50": round(pct(later, 50), 3),
        "rtt_ms_p99": round(pct(later, 99), 3),
        "service_ms_mean": round(statistics.mean(service[1:] or service), 3) if service else 0.0,
        "row_encodings": encodings,
        "row_bytes_mean": round(row_bytes / sum(widths), 1) if widths else 0.0,
    }


def replay_rows(cases: Sequence[GrammarCase], outs: Sequence[Outcome]) -> list[ReplayRow]:
    return [
        ReplayRow(c.kind.value, c.text, o.result.output_ids, o.result.finish_reason == "stop")
        for c, o in zip(cases, outs, strict=True)
        if o.result is not None
    ]
