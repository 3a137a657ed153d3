"""Load test for the tokenizer service alone (not part of CI's pass/fail timing).

Starts the tokenizer service against a stub scheduler (a real gRPC server speaking the session
protocol that answers every submission with a fixed token stream), so only the front door's
costs count: Tokenize requests/s and p99, and streaming detokenization (Generate with stream)
requests/s, tokens/s and p99.

    python tests/load/tokenizer_load.py --seconds 10 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import grpc

from radixmesh_bench.stack import pct
from radixmesh_wire.packing import pack_i32
from radixmesh_wire.pb import api_pb2, api_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from services.launcher import check_ready, free_port

TOKENS = [504, 3575, 282, 4649, 314, 7042, 30, 198] * 4  # 32 tokens of real text


class StubScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Answers each submit with TOKENS in chunks of 4 tokens, then finishes."""

    async def Session(
        self,
        request_iterator: AsyncIterator[scheduler_pb2.FrontendMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[scheduler_pb2.SchedulerMessage]:
        out: asyncio.Queue[scheduler_pb2.SchedulerMessage] = asyncio.Queue()
        first = await anext(aiter(request_iterator))
        yield scheduler_pb2.SchedulerMessage(
            hello=scheduler_pb2.SchedulerHello(
                session_id=first.hello.session_id, kv_capacity=1 << 20, context_length=8192
            )
        )

        async def read() -> None:
            async for msg in request_iterator:
                if msg.WhichOneof("kind") != "submit":
                    continue
                key = msg.submit.key
                for i in range(0, len(TOKENS), 4):
                    last = i + 4 >= len(TOKENS)
                    m = scheduler_pb2.SchedulerMessage(
                        keys=pack_i32([key] * 4), events=pack_i32(TOKENS[i : i + 4])
                    )
                    if last:
                        m.extras.add(key=key, finish_reason=api_pb2.FINISH_REASON_LENGTH)
                    out.put_nowait(m)

        task = asyncio.create_task(read())
        try:
            while True:
                yield await out.get()
        finally:
            task.cancel()

    async def GetStats(self, request, context):  # type: ignore[no-untyped-def]
        return api_pb2.Stats()


async def _drive(
    stub: api_pb2_grpc.RadixMeshStub, kind: str, seconds: float, concurrency: int
) -> dict[str, float]:
    lat: list[float] = []
    tokens = 0
    stop_at = time.monotonic() + seconds
    text = "The quick brown fox jumps over the lazy dog. " * 8

    async def worker() -> None:
        nonlocal tokens
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            if kind == "tokenize":
                await stub.Tokenize(api_pb2.TokenizeRequest(text=text))
            else:
                req = api_pb2.GenerateRequest(text="Hello", stream=True)
                req.sampling.max_new_tokens = 32
                async for msg in stub.Generate(req):
                    if msg.WhichOneof("response") == "complete":
                        tokens += msg.complete.completion_tokens
            lat.append((time.perf_counter() - t0) * 1e3)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    out = {
        "requests": len(lat),
        "requests_per_s": round(len(lat) / wall, 1),
        "p50_ms": round(pct(lat, 50), 2),
        "p99_ms": round(pct(lat, 99), 2),
    }
    if kind == "stream":
        out["tokens_per_s"] = round(tokens / wall, 1)
    return out


async def main_async(ns: argparse.Namespace) -> dict:
    sched_port, tok_port = free_port(), free_port()
    server = grpc.aio.server()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(StubScheduler(), server)
    server.add_insecure_port(f"127.0.0.1:{sched_port}")
    await server.start()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokenizer_service",
            "--port",
            str(tok_port),
            "--scheduler-address",
            f"127.0.0.1:{sched_port}",
            "--log-level",
            "warning",
        ]
    )
    try:
        addr = f"127.0.0.1:{tok_port}"
        deadline = time.monotonic() + 120
        while not await check_ready(addr):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("tokenizer service did not become ready")
            await asyncio.sleep(0.2)
        async with grpc.aio.insecure_channel(addr) as chan:
            stub = api_pb2_grpc.RadixMeshStub(chan)
            return {
                "bench": "tokenizer_load",
                "concurrency": ns.concurrency,
                "tokenize": await _drive(stub, "tokenize", ns.seconds, ns.concurrency),
                "stream_detokenize": await _drive(stub, "stream", ns.seconds, ns.concurrency),
            }
    finally:
        proc.terminate()
        proc.wait()
        await server.stop(0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=32)
    ns = p.parse_args()
    print(json.dumps(asyncio.run(main_async(ns)), indent=2))


if __name__ == "__main__":
    main()
