"""Front-door load test: N concurrent streams through ONE real front door (not part of CI).

A scheduler stand-in (a real gRPC server speaking scheduler.proto, in its own process) answers
the front door's session like a scheduler at full batch: every `--step-ms` it sends ONE
SchedulerMessage with the next token of every live request (packed keys/events) and the
finishes; with flow control it never runs ahead of what the front door reads, so "as fast as
asked". The clients (this process) open `--streams` concurrent streams, split over the
protocols of `--protocols`:

- sglang: HTTP POST /generate with stream=true, read as `sglang.bench_serving --backend sglang`
  reads it (cumulative `text` and `meta_info.completion_tokens` per `data:` event);
- openai: HTTP POST /v1/chat/completions with stream=true (delta events, usage at the end);
- completions: HTTP POST /v1/completions with stream=true (text events, usage at the end);
- grpc: RadixMesh.Generate with stream=true (GenerateChunk messages).

Each client loop runs streams back to back until `--seconds` have passed. Reported (JSON):
delivered output tokens per second of wall time and per second of the front door's CPU time
(user + system of the front-door process, from /proc: `tokens_per_core_s`), the front door's
CPU utilisation, events per token, and inter-token delay: its mean (all gaps between
consecutive events of a stream over the tokens they brought) and per-event percentiles (the
gap divided by the tokens the later event carried), per protocol and overall.

    python tests/load/front_door_load.py --streams 512 --seconds 20
    python tests/load/front_door_load.py --streams 1024 --protocols sglang --step-ms 50

`--front-door-pid-file PATH` writes the front door's pid (to attach py-spy while it runs).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from radixmesh_bench.stack import pct
from radixmesh_wire.packing import pack_i32
from radixmesh_wire.pb import api_pb2, api_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from services.launcher import check_ready, free_port

# Text the stand-in "generates" (tokenized with the served model's tokenizer, so the front
# door detokenizes real pieces: words, punctuation, newlines and multi-byte characters).
SAMPLE = (
    "The front door turns every token of every stream into an event. Caf\u00e9 na\u00efve "
    "r\u00e9sum\u00e9, \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 and an emoji \U0001f680 "
    "ride along.\nNumbers 12345 and code `x = f(y) + 1;` keep the detokenizer honest.\n"
)


SERVED_NAME = "front-door-load"
OPENAI = ("openai", "completions")  # the OpenAI-shaped streams (delta text, no token counts)

LENS_ENV = "FRONT_DOOR_LOAD_LENS"  # the parent's TextTokens table, for client processes

_loads: Callable[[bytes], Any] = json.loads
try:  # the clients parse every event: orjson keeps them from being the bottleneck
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - orjson is optional
    pass

# ---------------------------------------------------------------- the scheduler stand-in


class StandIn(scheduler_pb2_grpc.SchedulerServicer):
    """One step loop per session: every `step_s`, one message with one token for every live
    request; a request finishes (LENGTH) after its max_new_tokens."""

    def __init__(self, tokens: list[int], step_s: float) -> None:
        self.tokens = tokens
        self.step_s = step_s

    async def Session(  # noqa: C901 - one loop: hello, submits/aborts, steps
        self,
        request_iterator: AsyncIterator[scheduler_pb2.FrontendMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[scheduler_pb2.SchedulerMessage]:
        first = await anext(aiter(request_iterator))
        yield scheduler_pb2.SchedulerMessage(
            hello=scheduler_pb2.SchedulerHello(
                session_id=first.hello.session_id,
                kv_capacity=1 << 24,
                context_length=1 << 16,
                instance_id="stand-in",
            )
        )
        live: dict[int, list[int]] = {}  # key -> [position, remaining, fresh]
        rids: dict[str, int] = {}
        wake = asyncio.Event()

        async def read() -> None:
            async for msg in request_iterator:
                kind = msg.WhichOneof("kind")
                if kind == "submit":
                    s = msg.submit
                    n = s.sampling.max_new_tokens if s.sampling.HasField("max_new_tokens") else 16
                    live[s.key] = [len(s.output_ids), max(n - len(s.output_ids), 0), 1]
                    rids[s.rid] = s.key
                    wake.set()
                elif kind == "abort":
                    key = rids.pop(msg.abort.rid, None)
                    if key is not None:
                        live.pop(key, None)

        task = asyncio.create_task(read())
        toks, n_toks = self.tokens, len(self.tokens)
        try:
            next_at = time.monotonic()
            while True:
                if not live:
                    wake.clear()
                    await wake.wait()
                    next_at = time.monotonic()
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                next_at = max(next_at + self.step_s, time.monotonic())
                keys: list[int] = []
                events: list[int] = []
                msg = scheduler_pb2.SchedulerMessage()
                for key, st in list(live.items()):
                    if st[1] > 0:
                        keys.append(key)
                        events.append(toks[st[0] % n_toks])
                        st[0] += 1
                        st[1] -= 1
                    if st[2] or st[1] == 0:
                        ex = msg.extras.add(key=key)
                        if st[2]:
                            ex.cached_tokens = 0
                            st[2] = 0
                        if st[1] == 0:
                            ex.finish_reason = api_pb2.FINISH_REASON_LENGTH
                            del live[key]
                msg.keys = pack_i32(keys)
                msg.events = pack_i32(events)
                yield msg
        finally:
            task.cancel()

    async def GetStats(self, request, context):  # type: ignore[no-untyped-def]
        return api_pb2.Stats()


async def serve_stand_in(port: int, tokens: list[int], step_s: float) -> None:
    server = grpc.aio.server()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(StandIn(tokens, step_s), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


# ---------------------------------------------------------------- the clients


@dataclass
class Tally:
    streams: int = 0
    failed: int = 0
    tokens: int = 0
    events: int = 0
    itl_ms: list[float] = field(default_factory=list)  # per event: gap / tokens it carried
    gap_ms: float = 0.0  # sum of the gaps behind itl_ms ...
    gap_tokens: int = 0  # ... and of the tokens they brought: mean ITL = gap_ms / gap_tokens
    errors: list[str] = field(default_factory=list)

    def event(self, last: float, tokens: int) -> float:
        now = time.perf_counter()
        if tokens > 0:
            self.events += 1
            self.tokens += tokens
            if last:
                self.itl_ms.append((now - last) * 1e3 / tokens)
                self.gap_ms += (now - last) * 1e3
                self.gap_tokens += tokens
            return now
        return last

    def fail(self, why: str) -> None:
        self.failed += 1
        if len(self.errors) < 5:
            self.errors.append(why[:300])


class TextTokens:
    """Tokens behind a stream's text so far. OpenAI deltas carry text, not token counts (an
    event may carry several tokens), so the client counts them from the length of the text it
    has: every stream generates the same token sequence, whose cumulative text lengths
    (`lens[k]`: characters of the first k tokens, as the front door detokenizes them) the
    parent computes once. A held-back character (a token that ends mid-UTF-8) can shift a
    count by one; the stream's usage total corrects its sum at the end."""

    def __init__(self, lens: list[int]) -> None:
        self.lens = lens

    def count(self, chars: int) -> int:
        """The fewest tokens whose text is at least `chars` long."""
        return bisect.bisect_left(self.lens, chars)


async def _sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    async for line in resp.content:
        if not line.startswith(b"data: "):
            continue
        body = line[6:].strip()
        if body == b"[DONE]":
            return
        yield _loads(body)


async def sglang_stream(http: aiohttp.ClientSession, url: str, ns: argparse.Namespace, t: Tally):
    body = {
        "text": "Tell me a story.",
        "sampling_params": {"max_new_tokens": ns.output_tokens, "ignore_eos": True},
        "stream": True,
    }
    async with http.post(f"{url}/generate", json=body) as resp:
        if resp.status != 200:
            t.fail(f"sglang {resp.status}: {await resp.text()}")
            return
        last, seen, text = 0.0, 0, ""
        async for ev in _sse_events(resp):
            if "error" in ev:
                t.fail(f"sglang: {ev}")
                return
            n = int(ev["meta_info"]["completion_tokens"])
            if not ev["text"].startswith(text):  # cumulative text never shrinks
                t.fail("sglang: text is not cumulative")
            text = ev["text"]
            last = t.event(last, n - seen)
            seen = n
    t.streams += 1


async def openai_stream(
    http: aiohttp.ClientSession, url: str, ns: argparse.Namespace, t: Tally, chat: bool
):
    body: dict[str, Any] = {
        "model": SERVED_NAME,
        "max_tokens": ns.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if chat:
        body["messages"] = [{"role": "user", "content": "Tell me a story."}]
    else:
        body["prompt"] = "Tell me a story."
    path, name = ("/v1/chat/completions", "openai") if chat else ("/v1/completions", "completions")
    async with http.post(f"{url}{path}", json=body) as resp:
        if resp.status != 200:
            t.fail(f"{name} {resp.status}: {await resp.text()}")
            return
        last, seen, chars, usage = 0.0, 0, 0, 0
        async for ev in _sse_events(resp):
            if "error" in ev:
                t.fail(f"{name}: {ev}")
                return
            if ev.get("usage"):
                usage = int(ev["usage"]["completion_tokens"])
            for ch in ev.get("choices", []):
                text = ch.get("delta", {}).get("content") if chat else ch.get("text")
                if text:
                    chars += len(text)
                    n = max(ns.text_tokens.count(chars), seen + 1)
                    last = t.event(last, n - seen)
                    seen = n
        t.tokens += usage - seen  # the usage total is exact
    t.streams += 1


async def grpc_stream(stub: api_pb2_grpc.RadixMeshStub, ns: argparse.Namespace, t: Tally):
    req = api_pb2.GenerateRequest(
        input_ids=api_pb2.TokenIds(ids=[1, 2, 3, 4]),
        stream=True,
        sampling=api_pb2.SamplingParams(max_new_tokens=ns.output_tokens, ignore_eos=True),
    )
    last = 0.0
    try:
        async for msg in stub.Generate(req):
            if msg.WhichOneof("response") == "chunk":
                last = t.event(last, len(msg.chunk.token_ids))
    except grpc.aio.AioRpcError as exc:
        t.fail(f"grpc {exc.code().name}: {exc.details()}")
        return
    t.streams += 1


async def drive(http_url: str, grpc_addr: str, ns: argparse.Namespace) -> dict[str, Tally]:
    protocols = ns.protocols.split(",")
    tallies = {p: Tally() for p in protocols}
    stop_at = time.monotonic() + ns.seconds
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    async with (
        aiohttp.ClientSession(connector=conn, timeout=timeout) as http,
        grpc.aio.insecure_channel(grpc_addr) as chan,
    ):
        stub = api_pb2_grpc.RadixMeshStub(chan)

        async def loop(p: str) -> None:
            t = tallies[p]
            while time.monotonic() < stop_at and not t.failed:  # a failure ends its loop
                try:
                    if p == "sglang":
                        await sglang_stream(http, http_url, ns, t)
                    elif p in OPENAI:
                        await openai_stream(http, http_url, ns, t, chat=p == "openai")
                    else:
                        await grpc_stream(stub, ns, t)
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    t.fail(f"{p}: {exc!r}")

        await asyncio.gather(*(loop(protocols[i % len(protocols)]) for i in range(ns.streams)))
    return tallies


# ---------------------------------------------------------------- the run


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sample_tokens(output_tokens: int) -> tuple[list[int], list[int]]:
    """The stand-in's token cycle, and the text length of each prefix of a stream's
    `output_tokens` tokens as the front door's detokenizer emits them (`TextTokens`)."""
    from services.model_store import resolve_model
    from tokenizer_service.detokenizer import IncrementalDetokenizer
    from tokenizer_service.tokenization import Tokenization

    tok = Tokenization(resolve_model("default"))
    tokens = tok.encode(SAMPLE, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok.decoder(True))
    lens = [0]
    for k in range(output_tokens):
        lens.append(lens[-1] + len(detok.push([tokens[k % len(tokens)]])))
    return tokens, lens


def _summary(t: Tally, wall: float, cpu: float | None) -> dict:
    """`cpu`: the front door's CPU seconds (only for the overall figure: protocols share it)."""
    return {
        "streams_completed": t.streams,
        "streams_failed": t.failed,
        "tokens": t.tokens,
        "events": t.events,
        "tokens_per_s": round(t.tokens / wall, 1),
        **({"tokens_per_core_s": round(t.tokens / cpu, 1)} if cpu else {}),
        "events_per_token": round(t.events / t.tokens, 3) if t.tokens else 0.0,
        # the front door's CPU per event: what a change of the per-event path moves, apart
        # from how many events the load made (tokens_per_core_s follows events_per_token)
        **({"cpu_us_per_event": round(cpu * 1e6 / t.events, 1)} if cpu and t.events else {}),
        # the mean is the one to compare across runs: when events carry several tokens the
        # per-event quantiles change shape (fewer near-zero gaps of events read in a burst)
        "itl_mean_ms": round(t.gap_ms / t.gap_tokens, 2) if t.gap_tokens else 0.0,
        "itl_p50_ms": round(pct(t.itl_ms, 50), 2),
        "itl_p99_ms": round(pct(t.itl_ms, 99), 2),
        **({"errors": t.errors} if t.errors else {}),
    }


def hold_summary(port: int) -> dict:
    """The front door's own `frontdoor_token_hold_seconds` histogram (per event, how long its
    oldest token waited in the front door): events, mean, and the bucket bounds holding the
    median and the 99th percentile (an upper bound of each)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    buckets: list[tuple[float, float]] = []
    count = total = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name != "radixmesh_frontdoor_token_hold_seconds":
            continue
        for smp in fam.samples:
            if smp.name.endswith("_bucket"):
                buckets.append((float(smp.labels["le"]), smp.value))
            elif smp.name.endswith("_count"):
                count = smp.value
            elif smp.name.endswith("_sum"):
                total = smp.value
    if not count:
        return {"events": 0}

    def upper(q: float) -> float:
        return next(le for le, c in sorted(buckets) if c >= q * count)

    return {
        "events": int(count),
        "mean_ms": round(1e3 * total / count, 2),
        "p50_at_most_ms": round(1e3 * upper(0.5), 1),
        "p99_at_most_ms": round(1e3 * upper(0.99), 1),
    }


async def wait_ready(addr: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while not await check_ready(addr):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the front door did not become ready")
        await asyncio.sleep(0.2)


def run_clients(http_url: str, grpc_addr: str, ns: argparse.Namespace) -> dict[str, Tally]:
    """`--client-procs` processes share the streams, so that the clients (Python too) are not
    what limits the front door; their tallies are merged."""
    if ns.client_procs <= 1:
        return asyncio.run(drive(http_url, grpc_addr, ns))
    me = str(Path(__file__).resolve())
    procs = []
    for k in range(ns.client_procs):
        share = ns.streams // ns.client_procs + (k < ns.streams % ns.client_procs)
        argv = [*sys.argv[1:], "--client-of", f"{http_url},{grpc_addr}", "--streams", str(share)]
        procs.append(subprocess.Popen([sys.executable, me, *argv], stdout=subprocess.PIPE))
    tallies: dict[str, Tally] = {}
    for proc in procs:
        out, _ = proc.communicate()
        for p, d in json.loads(out).items():
            merge(tallies.setdefault(p, Tally()), Tally(**d))
    return tallies


def merge(into: Tally, t: Tally) -> None:
    into.streams += t.streams
    into.failed += t.failed
    into.tokens += t.tokens
    into.events += t.events
    into.itl_ms += t.itl_ms
    into.gap_ms += t.gap_ms
    into.gap_tokens += t.gap_tokens
    into.errors += t.errors


async def main_async(ns: argparse.Namespace) -> dict:
    sched_port, grpc_port, http_port = free_port(), free_port(), free_port()
    metrics_port = free_port()
    me = str(Path(__file__).resolve())
    tokens, lens = sample_tokens(ns.output_tokens)
    ns.text_tokens = TextTokens(lens)
    os.environ[LENS_ENV] = json.dumps(lens)  # for the client processes
    stand_in = subprocess.Popen(
        [sys.executable, me, "--stand-in", str(sched_port), "--step-ms", str(ns.step_ms)],
        env={**os.environ, "FRONT_DOOR_LOAD_TOKENS": json.dumps(tokens)},
    )
    front = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokenizer_service",
            "--port",
            str(grpc_port),
            "--http-port",
            str(http_port),
            "--scheduler-address",
            f"127.0.0.1:{sched_port}",
            "--log-level",
            "warning",
            "--served-model-name",
            SERVED_NAME,
            "--metrics-port",
            str(metrics_port),
            *ns.front_door_args.split(),
        ]
    )
    try:
        await wait_ready(f"127.0.0.1:{grpc_port}", front)
        if ns.front_door_pid_file:
            Path(ns.front_door_pid_file).write_text(str(front.pid))
        cpu0, t0 = cpu_seconds(front.pid), time.perf_counter()
        urls = (f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}")
        tallies = await asyncio.to_thread(run_clients, *urls, ns)
        wall, cpu = time.perf_counter() - t0, cpu_seconds(front.pid) - cpu0
        hold = await asyncio.to_thread(hold_summary, metrics_port)
    finally:
        front.terminate()
        stand_in.terminate()
        front.wait()
        stand_in.wait()
    total = Tally()
    for t in tallies.values():
        merge(total, t)
    return {
        "bench": "front_door_load",
        "streams": ns.streams,
        "protocols": ns.protocols,
        "output_tokens": ns.output_tokens,
        "step_ms": ns.step_ms,
        "offered_tokens_per_s": round(ns.streams * 1000 / ns.step_ms, 1),
        "front_door_args": ns.front_door_args,
        "client_procs": ns.client_procs,
        "wall_s": round(wall, 2),
        "front_door_cpu_s": round(cpu, 2),
        "front_door_cores_busy": round(cpu / wall, 2),
        "overall": _summary(total, wall, cpu),
        "front_door_token_hold": hold,
        "by_protocol": {p: _summary(t, wall, None) for p, t in tallies.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--streams", type=int, default=512, help="concurrent streams")
    p.add_argument("--seconds", type=float, default=20.0, help="start new streams this long")
    p.add_argument("--output-tokens", type=int, default=256, help="tokens per stream")
    p.add_argument(
        "--step-ms", type=float, default=20.0, help="stand-in scheduler step period (ms)"
    )
    p.add_argument(
        "--protocols",
        default="sglang,openai,grpc",
        help="comma-separated: sglang,openai (chat),completions,grpc",
    )
    p.add_argument("--front-door-args", default="", help="extra flags for the front door")
    p.add_argument("--front-door-pid-file", default="", help="write the front door's pid here")
    p.add_argument("--client-procs", type=int, default=2, help="client processes")
    p.add_argument("--stand-in", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--client-of", default="", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.client_of:  # a child process: clients only, tallies as JSON on stdout
        ns.text_tokens = TextTokens(json.loads(os.environ[LENS_ENV]))
        http_url, grpc_addr = ns.client_of.split(",")
        tallies = asyncio.run(drive(http_url, grpc_addr, ns))
        print(json.dumps({p: vars(t) for p, t in tallies.items()}))
        return
    if ns.stand_in:  # the child process: the scheduler stand-in only
        tokens = json.loads(os.environ["FRONT_DOOR_LOAD_TOKENS"])
        asyncio.run(serve_stand_in(ns.stand_in, tokens, ns.step_ms / 1000))
        return
    for proto in ns.protocols.split(","):
        if proto not in ("sglang", *OPENAI, "grpc"):
            p.error(f"unknown protocol {proto!r}")
    print(json.dumps(asyncio.run(main_async(ns)), indent=2))


if __name__ == "__main__":
    main()
