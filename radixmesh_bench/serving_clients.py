"""The clients of `radixmesh bench serving`: one request over SGLang's /generate, OpenAI's
/v1/completions (SSE) or the project's gRPC API, timed the way sglang.bench_serving times it,
and `drive`, which sends a run's requests from one event loop."""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Req:
    prompt: str
    prompt_len: int  # in the served model's tokens
    output_len: int


@dataclass
class Out:
    ok: bool = False
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_len: int = 0
    error: str = ""


# -- clients -------------------------------------------------------------------------------------
async def _sse_lines(resp: Any) -> Any:
    async for raw in resp.content:
        line = raw.strip()
        if not line:
            continue
        text = line.decode()
        if text.startswith("data: "):
            text = text[6:]
        if text == "[DONE]":
            return
        yield json.loads(text)


async def send_sglang(session: Any, url: str, r: Req) -> Out:
    payload = {
        "text": r.prompt,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": r.output_len, "ignore_eos": True},
        "stream": True,
    }
    out, t0 = Out(), time.perf_counter()
    last, last_n = t0, 0
    async with session.post(url + "/generate", json=payload) as resp:
        if resp.status != 200:
            return Out(error=f"HTTP {resp.status}: {await resp.text()}")
        async for data in _sse_lines(resp):
            if "error" in data:
                return Out(error=str(data["error"]))
            n = data["meta_info"]["completion_tokens"]
            if n == last_n:
                continue
            now = time.perf_counter()
            if last_n == 0:
                out.ttft = now - t0
            else:  # a chunk of k tokens: k equal gaps, as bench_serving counts them
                out.itl.extend([(now - last) / (n - last_n)] * (n - last_n))
            last, last_n = now, n
    out.ok, out.latency, out.output_len = True, time.perf_counter() - t0, last_n
    return out


async def send_openai(session: Any, url: str, r: Req) -> Out:
    payload = {
        "model": None,
        "prompt": r.prompt,
        "temperature": 0.0,
        "max_tokens": r.output_len,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out, t0 = Out(), time.perf_counter()
    last = t0
    async with session.post(url + "/v1/completions", json=payload) as resp:
        if resp.status != 200:
            return Out(error=f"HTTP {resp.status}: {await resp.text()}")
        async for data in _sse_lines(resp):
            if "error" in data:
                return Out(error=str(data["error"]))
            if data.get("usage"):
                out.output_len = data["usage"]["completion_tokens"]
            if data["choices"] and data["choices"][0]["text"]:
                now = time.perf_counter()
                if out.ttft == 0.0:
                    out.ttft = now - t0
                else:
                    out.itl.append(now - last)
                last = now
    out.ok, out.latency = True, time.perf_counter() - t0
    return out


@dataclass
class GrpcStream:
    """One gRPC stream, timed: when each chunk arrived (time.perf_counter) with its token count,
    and the final result (None when the stream ended without one)."""

    t0: float
    t1: float
    arrivals: list[tuple[float, int]]
    result: Any  # radixmesh.api.GenerateResult | None


async def timed_grpc_stream(client: Any, *args: Any, **request: Any) -> GrpcStream:
    """The gRPC client `bench serving` and the GPU parts share: `client.stream(*args,
    **request)` (a radixmesh.api.AsyncClient), each chunk's arrival noted as it comes."""
    from radixmesh.api import Chunk, GenerateResult

    t0 = time.perf_counter()
    arrivals: list[tuple[float, int]] = []
    result = None
    async for item in client.stream(*args, **request):
        if isinstance(item, Chunk):
            arrivals.append((time.perf_counter(), len(item.token_ids)))
        elif isinstance(item, GenerateResult):
            result = item
    return GrpcStream(t0, time.perf_counter(), arrivals, result)


def chunk_gaps(arrivals: list[tuple[float, int]]) -> list[float]:
    """ITL samples as sglang.bench_serving counts them: a chunk of k tokens counts as k gaps of
    1/k of the time since the chunk before (a chunk without tokens as one gap)."""
    itl: list[float] = []
    for (ta, _), (tb, n) in zip(arrivals, arrivals[1:], strict=False):
        k = max(n, 1)
        itl.extend([(tb - ta) / k] * k)
    return itl


async def send_grpc(client: Any, r: Req) -> Out:
    from radixmesh.api import RadixMeshError

    try:
        s = await timed_grpc_stream(
            client, r.prompt, max_new_tokens=r.output_len, temperature=0, ignore_eos=True
        )
    except RadixMeshError as exc:
        return Out(error=str(exc))
    got = [a for a in s.arrivals if a[1]]  # the chunks that carry tokens (not rollbacks alone)
    out = Out(ok=True, latency=s.t1 - s.t0, itl=chunk_gaps(got))
    if got:
        out.ttft = got[0][0] - s.t0
    if s.result is not None:
        out.output_len = s.result.completion_tokens
    return out


# -- one run -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    """One run's load: `reqs` to `backend` (sglang/openai at `http_url`, grpc at `grpc_ep`),
    Poisson arrivals at `rate`, at most `conc` in flight (0: no cap), arrivals drawn from
    `seed`."""

    backend: str
    http_url: str
    grpc_ep: str
    reqs: list[Req]
    rate: float
    conc: int
    seed: int

    def share(self, k: int, n: int) -> RunSpec:
        """Client process k of n: every n-th request, rate/n and conc/n, its own seed."""
        return RunSpec(
            self.backend,
            self.http_url,
            self.grpc_ep,
            self.reqs[k::n],
            self.rate if math.isinf(self.rate) else self.rate / n,
            max(self.conc // n, 1) if self.conc > 0 else 0,
            self.seed + k,
        )


async def drive(spec: RunSpec, barrier: Any = None) -> tuple[list[Out], float, float]:
    """Send the run's requests and return their outcomes with the start and end times
    (time.perf_counter, which is system-wide on Linux, so client processes' times compare).
    `barrier`: a multiprocessing.Barrier that every client process passes before its first
    request."""
    import aiohttp
    from radixmesh.api import AsyncClient

    backend, http_url, reqs, rate = spec.backend, spec.http_url, spec.reqs, spec.rate
    rng = random.Random(spec.seed)
    sem = asyncio.Semaphore(spec.conc if spec.conc > 0 else max(len(reqs), 1))
    timeout = aiohttp.ClientTimeout(total=6 * 3600)
    async with (
        # No connection cap (aiohttp's default is 100): at rate inf every request is in flight
        # at once, as with the gRPC client and sglang.bench_serving.
        aiohttp.ClientSession(
            timeout=timeout, read_bufsize=10 << 20, connector=aiohttp.TCPConnector(limit=0)
        ) as session,
        AsyncClient(spec.grpc_ep) as client,
    ):
        send: Callable[[Req], Awaitable[Out]]
        if backend == "sglang":
            send = lambda r: send_sglang(session, http_url, r)  # noqa: E731
        elif backend == "openai":
            send = lambda r: send_openai(session, http_url, r)  # noqa: E731
        else:
            send = lambda r: send_grpc(client, r)  # noqa: E731

        async def limited(r: Req) -> Out:
            async with sem:
                return await send(r)

        if barrier is not None:
            await asyncio.to_thread(barrier.wait)
        tasks = []
        t0 = time.perf_counter()
        for r in reqs:
            tasks.append(asyncio.ensure_future(limited(r)))
            if not math.isinf(rate):
                await asyncio.sleep(rng.expovariate(rate))  # Poisson arrivals
        outs = await asyncio.gather(*tasks)
        return list(outs), t0, time.perf_counter()
