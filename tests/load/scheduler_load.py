"""Load test for the scheduler service alone (not part of CI's pass/fail timing).

The REAL scheduler process runs over gRPC against a FAKE model service (a grpc.aio ModelWorker
in this process that answers every step at once with one token per sampling row: admits and
extends with ``sample`` and every decode handle, no compute) and a FAKE front door (the
Scheduler.Session protocol: hello, then submits; deltas come back). So only the scheduler's
own costs count.

``load`` (default): for each running-batch size (64 and 256) ``--waiting`` more requests
(1,000) wait behind ``--max-running``; every request ignores EOS and asks 1,500-2,500 tokens,
and each client submits its next request when one finishes (a closed loop), so the batch stays
full, the backlog stays put and the KV pool never runs out (it did with unbounded outputs: at
256 running the window measured retraction and queue walks instead of decoding). Over a
window it measures steps/s (GetStats.steps) and the scheduler process's CPU time per step
(utime + stime from /proc/<pid>/stat). Goal: < 1 ms per step. The in-process split of the
same cost by phase, and the step codec's, is `radixmesh bench step-cost`.
``--profile`` adds a py-spy top-10 (self time) of the scheduler during a second window.

``check``: a correctness soak instead of a measurement. The fake model then *verifies*: every
KV slot it writes holds a hash of the token sequence up to that token, an admit's prefix slots
must form one unbroken chain, every row's whole sequence must still be in its slots (nothing
overwrote them) and tokens are a function of that hash, so the front door knows every request's
exact output in advance. A tiny KV pool, small chunks and many concurrent requests with shared
prefixes force eviction, chunked prefill and retraction; any wrong reuse of a slot shows up as
a wrong token or a broken chain, and a stall (no progress for 20 s) is reported as a deadlock.
At the end a second session opens: its cache-events snapshot must equal the blocks, each with
its tier, that the first session built from every flush's net changes (``cache_events_agree``).
``--host-kv N`` adds a host KV tier of N tokens (issue 31) to both: the fake model keeps a host
pool of slot hashes and runs the step's copies (saves, loads) before its work, so a wrong load
shows up as a broken chain, and cache events then move blocks between the tiers.

    python tests/load/scheduler_load.py                      # load, prints JSON
    python tests/load/scheduler_load.py --profile
    python tests/load/scheduler_load.py check --kv 700 --requests 300
    python tests/load/scheduler_load.py check --kv 400 --host-kv 2000   # with the host tier
    python tests/load/scheduler_load.py chunk-stall --stall-s 10   # a known deadlock
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from radixmesh_bench.pyspy_summary import summarize_raw
from radixmesh_wire.packing import pack_i32, unpack_i32
from radixmesh_wire.pb import api_pb2, model_pb2, model_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from services.launcher import check_ready, free_port
from tokenizer_service.routing.deltas import unpack_message

EOS = 2
VOCAB = 49152
_MASK = (1 << 48) - 1
H0 = 0x9E3779B97F4A


def chain(h: int, tok: int) -> int:
    """Hash of a sequence extended by one token (deterministic across processes)."""
    return (h * 1_000_003 + tok + 1) & _MASK


def next_token(h: int) -> int:
    """The fake model's greedy choice after a sequence with hash ``h`` (never EOS)."""
    return 1000 + (h >> 13) % 30000


def expected_output(prompt: list[int], n: int) -> list[int]:
    h = H0
    for t in prompt:
        h = chain(h, t)
    out = []
    for _ in range(n):
        t = next_token(h)
        out.append(t)
        h = chain(h, t)
    return out


# -- fake model service --------------------------------------------------------------------------
@dataclass
class _Seq:
    slots: list[int]
    hashes: list[int]  # hashes[i]: hash of the sequence up to and including token i
    pending: int | None = None  # sampled, not yet in KV (the next decode's input)


class StepViolation(Exception):
    pass


class FakeModel(model_pb2_grpc.ModelWorkerServicer):
    """Answers steps at once. ``verify``: keep a hash per KV slot and check the scheduler's use
    of slots (see the module docstring); otherwise no per-request state at all."""

    def __init__(
        self,
        capacity: int,
        context_length: int = 1 << 20,
        verify: bool = False,
        host_capacity: int = 0,
    ) -> None:
        self.capacity = capacity
        self.context_length = context_length
        self.verify = verify
        self.host_capacity = host_capacity
        self.steps = 0
        self.violations: list[str] = []
        self.pool: dict[int, tuple[int, int]] = {}  # slot -> (hash, parent hash)
        self.host: dict[int, tuple[int, int]] = {}  # host slot -> the same (issue 31)
        self.seqs: dict[int, _Seq] = {}

    def info(self) -> model_pb2.WorkerInfo:
        return model_pb2.WorkerInfo(
            model_name="fake",
            kv_capacity=self.capacity,
            vocab_size=VOCAB,
            context_length=self.context_length,
            eos_token_ids=[EOS],
            device="none",
            dtype="none",
            attention_backend="none",
            host_kv_capacity=self.host_capacity,
        )

    async def GetWorkerInfo(
        self, request: model_pb2.WorkerInfoRequest, context: grpc.aio.ServicerContext
    ) -> model_pb2.WorkerInfo:
        return self.info()

    async def Steps(
        self,
        request_iterator: AsyncIterator[model_pb2.StepRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[model_pb2.StepReply]:
        it = aiter(request_iterator)
        first = await anext(it, None)
        if first is None or first.WhichOneof("kind") != "open":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "first message: open")
            return
        self.seqs.clear()
        self.pool.clear()
        self.host.clear()
        yield model_pb2.StepReply(
            opened=model_pb2.SessionOpened(session_id=first.open.session_id, info=self.info())
        )
        async for msg in it:
            if msg.WhichOneof("kind") == "step":
                self.steps += 1
                yield model_pb2.StepReply(result=self.run_step(msg.step))

    def run_step(self, step: model_pb2.Step) -> model_pb2.StepResult:
        if self.verify:
            try:
                return self._verified(step)
            except StepViolation as exc:
                self.violations.append(f"step {step.step_id}: {exc}")
                return model_pb2.StepResult(step_id=step.step_id, error=str(exc))
        # Fast path: the rows are the sampling admits/extends, then every decode handle.
        head = [a.handle for a in step.admits if a.sample]
        head += [e.handle for e in step.extends if e.sample]
        handles = pack_i32(head) + step.decode_handles if head else step.decode_handles
        n = len(handles) // 4
        return model_pb2.StepResult(
            step_id=step.step_id, handles=handles, tokens=_TOKEN * n, logprobs=_ZERO * n
        )

    # -- verifying path --------------------------------------------------------------------
    def _write(self, seq: _Seq, tokens: list[int], slots: list[int]) -> None:
        if len(tokens) != len(slots):
            raise StepViolation(f"{len(tokens)} tokens but {len(slots)} slots")
        h = seq.hashes[-1] if seq.hashes else H0
        for t, s in zip(tokens, slots, strict=True):
            if not 0 <= s < self.capacity:
                raise StepViolation(f"slot {s} out of range")
            nh = chain(h, t)
            self.pool[s] = (nh, h)
            seq.slots.append(s)
            seq.hashes.append(nh)
            h = nh

    def _check_whole(self, handle: int, seq: _Seq) -> None:
        pool = self.pool
        for i, (s, h) in enumerate(zip(seq.slots, seq.hashes, strict=True)):
            if pool.get(s, (None,))[0] != h:
                raise StepViolation(
                    f"handle {handle}: KV of position {i} (slot {s}) was "
                    "overwritten while the request uses it"
                )
        if len(set(seq.slots)) != len(seq.slots):
            raise StepViolation(f"handle {handle}: a slot appears twice in one sequence")

    def _sample(self, handle: int, seq: _Seq, rows: list[int], toks: list[int]) -> None:
        t = next_token(seq.hashes[-1])
        seq.pending = t
        rows.append(handle)
        toks.append(t)

    def _copy(self, step: model_pb2.Step) -> None:
        """The host tier's copies, in order: a slot's (hash, parent) moves with its KV."""
        for c in step.copies:
            src, dst = unpack_i32(c.src), unpack_i32(c.dst)
            frm, to, cap = (
                (self.pool, self.host, self.host_capacity)
                if c.to_host
                else (self.host, self.pool, self.capacity)
            )
            if len(src) != len(dst) or len(set(dst)) != len(dst):
                raise StepViolation("a copy's src and dst differ in length or repeat a slot")
            for s, d in zip(src, dst, strict=True):
                if s not in frm or not 0 <= d < cap:
                    raise StepViolation(f"copy of unwritten slot {s} or to bad slot {d}")
                to[d] = frm[s]

    def _verified(self, step: model_pb2.Step) -> model_pb2.StepResult:
        for h in unpack_i32(step.release_handles):
            self.seqs.pop(h, None)
        self._copy(step)
        rows: list[int] = []
        toks: list[int] = []
        touched: list[tuple[int, _Seq]] = []
        written: list[int] = []
        for a in step.admits:
            if a.handle in self.seqs:
                raise StepViolation(f"admit of live handle {a.handle}")
            prefix = unpack_i32(a.prefix_slots)
            seq = _Seq([], [])
            parent = H0
            for i, s in enumerate(prefix):
                entry = self.pool.get(s)
                if entry is None or entry[1] != parent:
                    raise StepViolation(
                        f"admit {a.handle}: prefix slot {s} (position {i}) does "
                        "not continue the chain: stale or foreign KV reused"
                    )
                seq.slots.append(s)
                seq.hashes.append(entry[0])
                parent = entry[0]
            new = unpack_i32(a.slots)
            self._write(seq, unpack_i32(a.input_ids), new)
            written.extend(new)
            self.seqs[a.handle] = seq
            touched.append((a.handle, seq))
            if a.sample:
                self._sample(a.handle, seq, rows, toks)
        for e in step.extends:
            known = self.seqs.get(e.handle)
            if known is None:
                raise StepViolation(f"extend of unknown handle {e.handle}")
            seq = known
            new = unpack_i32(e.slots)
            self._write(seq, unpack_i32(e.input_ids), new)
            written.extend(new)
            touched.append((e.handle, seq))
            if e.sample:
                self._sample(e.handle, seq, rows, toks)
        dslots = unpack_i32(step.decode_slots)
        dhandles = unpack_i32(step.decode_handles)
        if len(dslots) != len(dhandles):
            raise StepViolation("decode handles and slots differ in length")
        for h, s in zip(dhandles, dslots, strict=True):
            known = self.seqs.get(h)
            if known is None or known.pending is None:
                raise StepViolation(f"decode of handle {h} that has no sampled token")
            seq = known
            self._write(seq, [known.pending], [s])
            written.append(s)
            touched.append((h, seq))
            self._sample(h, seq, rows, toks)
        if len(set(written)) != len(written):
            raise StepViolation("two writes to one slot in one step")
        for h, seq in touched:
            self._check_whole(h, seq)
        return model_pb2.StepResult(
            step_id=step.step_id,
            handles=pack_i32(rows),
            tokens=pack_i32(toks),
            logprobs=_ZERO * len(rows),
        )


_TOKEN = pack_i32([1234])
_ZERO = b"\x00\x00\x00\x00"


async def start_fake_model(model: FakeModel) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
        ]
    )
    model_pb2_grpc.add_ModelWorkerServicer_to_server(model, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


# -- fake front door -----------------------------------------------------------------------------
@dataclass
class Tracked:
    prompt: list[int]
    max_new: int
    tokens: list[int] = field(default_factory=list)
    finish: int = 0
    error: str = ""
    cached: int = -1
    done: asyncio.Event = field(default_factory=asyncio.Event)


class FrontDoor:
    """One Scheduler.Session stream: submit requests, collect their deltas; cache events
    are applied to `held` (the scheduler's published blocks -> tier, "gpu" or "host") as a
    routing front door would."""

    def __init__(self, address: str, session_id: str = "load") -> None:
        self.session_id = session_id
        self.held: dict[int, str] = {}
        self.cache_messages = 0
        self.chan = grpc.aio.insecure_channel(
            address, options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.chan)
        self.out: asyncio.Queue[scheduler_pb2.FrontendMessage | None] = asyncio.Queue()
        self.reqs: dict[str, Tracked] = {}
        self.by_key: dict[int, Tracked] = {}
        self.tokens = 0
        self.messages = 0
        self._reader: asyncio.Task[None] | None = None

    async def open(self) -> None:
        async def outgoing() -> AsyncIterator[scheduler_pb2.FrontendMessage]:
            yield scheduler_pb2.FrontendMessage(
                hello=scheduler_pb2.FrontendHello(session_id=self.session_id)
            )
            while (m := await self.out.get()) is not None:
                yield m

        self.call = self.stub.Session(outgoing())
        hello = await self.call.read()
        assert hello.HasField("hello"), hello
        self.hello = hello.hello
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while (msg := await self.call.read()) is not grpc.aio.EOF:
            self.messages += 1
            if msg.HasField("cache"):
                self.cache_messages += 1
                c = msg.cache
                if c.reset:
                    self.held.clear()
                for h in c.removed:
                    self.held.pop(h, None)
                self.held.update(dict.fromkeys(c.added, "gpu"))
                self.held.update(dict.fromkeys(c.host, "host"))
            for key, u in unpack_message(msg).items():
                r = self.by_key.get(key)
                if r is None:
                    continue
                if u.rollback:
                    del r.tokens[len(r.tokens) - u.rollback :]
                r.tokens.extend(u.token_ids)
                self.tokens += len(u.token_ids)
                ex = u.extras
                if ex is None:
                    continue
                if ex.HasField("cached_tokens"):
                    r.cached = ex.cached_tokens
                if ex.error_code:
                    r.error = f"{ex.error_code}: {ex.error_message}"
                    r.done.set()
                elif ex.finish_reason:
                    r.finish = ex.finish_reason
                    r.done.set()

    def submit(self, rid: str, prompt: list[int], max_new: int) -> Tracked:
        t = self.reqs[rid] = Tracked(prompt, max_new)
        key = len(self.by_key) + 1
        self.by_key[key] = t
        s = api_pb2.SamplingParams(temperature=0.0, max_new_tokens=max_new, ignore_eos=True)
        self.out.put_nowait(
            scheduler_pb2.FrontendMessage(
                submit=scheduler_pb2.SubmitRequest(rid=rid, input_ids=prompt, sampling=s, key=key)
            )
        )
        return t

    def abort(self, rid: str) -> None:
        self.out.put_nowait(
            scheduler_pb2.FrontendMessage(abort=scheduler_pb2.AbortRequestInternal(rid=rid))
        )

    async def stats(self) -> api_pb2.Stats:
        return await self.stub.GetStats(api_pb2.GetStatsRequest(), timeout=10)

    async def close(self) -> None:
        self.out.put_nowait(None)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await self._reader
        self.call.cancel()
        await self.chan.close()


async def cache_events_agree(fd: FrontDoor, address: str, wait_s: float = 10.0) -> tuple[bool, int]:
    """After the run: a second session's opening snapshot must equal what `fd` built from the
    whole run's cache events (net changes over every flush, through eviction and aborts), every
    block in the same tier (GPU or host)."""
    late = FrontDoor(address, session_id="check-snapshot")
    await late.open()
    try:
        if late.hello.cache_block_tokens == 0:
            return not fd.held and not late.held, 0  # this scheduler publishes no blocks
        deadline = time.monotonic() + wait_s
        while late.cache_messages == 0 or late.held != fd.held:
            if time.monotonic() > deadline:
                return False, len(late.held)
            await asyncio.sleep(0.05)
        return True, len(late.held)
    finally:
        await late.close()


# -- the scheduler process -----------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def scheduler_process(
    model_port: int, args: list[str], log_dir: Path
) -> AsyncIterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "scheduler_service",
        "--port",
        str(port),
        f"--model-address=127.0.0.1:{model_port}",
        "--log-level",
        "warning",
        *args,
    ]
    log = (log_dir / f"scheduler-{port}.log").open("ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not await check_ready(f"127.0.0.1:{port}"):
            if proc.poll() is not None:
                raise RuntimeError(f"scheduler exited ({proc.returncode}); see {log.name}")
            if time.monotonic() > deadline:
                raise TimeoutError("scheduler not ready after 60 s")
            await asyncio.sleep(0.1)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def progress(msg: str) -> None:
    print(f"[scheduler-load] {msg}", file=sys.stderr, flush=True)


async def wait_for(cond, fd: FrontDoor, timeout: float, what: str) -> api_pb2.Stats:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        s = await fd.stats()
        if cond(s):
            return s
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: stats {s}")
        await asyncio.sleep(0.1)


# -- load --------------------------------------------------------------------------------------
def py_spy_top(pid: int, seconds: float, out_dir: Path, n: int = 10) -> list[dict] | str:
    exe = shutil.which("py-spy")
    if exe is None:
        return "py-spy not installed (pip install py-spy)"
    raw = out_dir / f"pyspy-{pid}.txt"
    r = subprocess.run(
        [
            exe,
            "record",
            "-p",
            str(pid),
            "-d",
            str(int(seconds)),
            "-r",
            "200",
            "-f",
            "raw",
            "-o",
            str(raw),
            "--nonblocking",
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0 or not raw.exists():
        return f"py-spy failed: {r.stderr.strip()[-300:]}"
    summary = summarize_raw(raw.read_text(), n)
    return [
        {"function": e["function"], "self_pct": e["pct"], "total_pct": e["total_pct"]}
        for e in summary["self"]
    ]


async def load_one(
    running: int,
    waiting: int,
    prompt_len: int,
    seconds: float,
    profile: bool,
    log_dir: Path,
    extra_args: list[str],
) -> dict:
    cap = 1 << 21
    model = FakeModel(cap)
    server, mport = await start_fake_model(model)
    rng = random.Random(running)
    args = ["--max-running", str(running), "--max-queue", str(running + waiting + 16), *extra_args]
    try:
        async with scheduler_process(mport, args, log_dir) as (proc, port):
            fd = FrontDoor(f"127.0.0.1:{port}")
            await fd.open()
            clients = [
                asyncio.create_task(_closed_loop(fd, i, prompt_len, rng.randrange(1500, 2500)))
                for i in range(running + waiting)
            ]
            try:
                await wait_for(
                    lambda s: s.running_requests == running and s.queue_length == waiting,
                    fd,
                    120,
                    "batch never filled",
                )
                await asyncio.sleep(1.0)  # past the admission transient
                s0, c0, m0, t0 = (
                    await fd.stats(),
                    cpu_seconds(proc.pid),
                    time.process_time(),
                    time.perf_counter(),
                )
                tok0 = fd.tokens
                await asyncio.sleep(seconds)
                s1, c1, m1, t1 = (
                    await fd.stats(),
                    cpu_seconds(proc.pid),
                    time.process_time(),
                    time.perf_counter(),
                )
                steps = s1.steps - s0.steps
                wall = t1 - t0
                out: dict[str, object] = {
                    "running": s1.running_requests,
                    "waiting": s1.queue_length,
                    "window_s": round(wall, 2),
                    "steps": steps,
                    "steps_per_s": round(steps / wall, 1),
                    "scheduler_cpu_ms_per_step": round(1e3 * (c1 - c0) / max(steps, 1), 3),
                    "scheduler_cpu_util": round((c1 - c0) / wall, 3),
                    "wall_ms_per_step": round(1e3 * wall / max(steps, 1), 3),
                    "fake_peers_cpu_ms_per_step": round(1e3 * (m1 - m0) / max(steps, 1), 3),
                    "tokens_per_s": round((fd.tokens - tok0) / wall),
                    "radix_ms_per_step": round(
                        1e3 * (s1.radix_seconds - s0.radix_seconds) / max(steps, 1), 4
                    ),
                    "retractions": s1.retractions - s0.retractions,
                    "finished_in_window": s1.finished_requests - s0.finished_requests,
                    "goal_met_under_1ms": (c1 - c0) / max(steps, 1) < 1e-3,
                }
                if profile:
                    progress(f"py-spy on the scheduler ({running} running)")
                    top: list[dict] | str = await asyncio.to_thread(
                        py_spy_top, proc.pid, min(seconds, 8), log_dir
                    )
                    out["py_spy_top10_self"] = top
                return out
            finally:
                for c in clients:
                    c.cancel()
                await fd.close()
    finally:
        await server.stop(None)


async def _closed_loop(fd: FrontDoor, i: int, prompt_len: int, max_new: int) -> None:
    """One client: a request, and when it finishes the next, so the batch stays full and the
    backlog stays put (an unbounded output would fill the KV pool within seconds at 256
    running and measure retraction instead). Outputs of 1,500-2,500 tokens: at 256 running a
    request finishes, and one is admitted, every ~8 steps, as in continuous batching."""
    rng = random.Random(i)
    n = 0
    while True:
        prompt = [rng.randrange(100, 40000) for _ in range(prompt_len)]
        await fd.submit(f"r{i}.{n}", prompt, max_new).done.wait()
        n += 1


async def run_load(ns: argparse.Namespace) -> dict:
    log_dir = Path(tempfile.mkdtemp(prefix="scheduler-load-"))
    report: dict = {
        "test": "scheduler_load",
        "cpus": os.cpu_count(),
        "prompt_tokens": ns.prompt_len,
        "waiting": ns.waiting,
        "logs": str(log_dir),
        "note": "one process (this one) plays both fake peers; CPU is shared",
    }
    for running in ns.running:
        progress(f"{running} running + {ns.waiting} waiting, {ns.seconds:.0f} s window")
        report[f"running_{running}"] = await load_one(
            running, ns.waiting, ns.prompt_len, ns.seconds, ns.profile, log_dir, ns.sched_arg
        )
    return report


# -- check -------------------------------------------------------------------------------------
def check_workload(n: int, seed: int) -> list[tuple[list[int], int]]:
    """Prompts of 20-200 tokens from a few shared roots with shared mid-level branches."""
    rng = random.Random(seed)
    roots = [[rng.randrange(100, 40000) for _ in range(rng.randrange(10, 80))] for _ in range(4)]
    mids = [[rng.randrange(100, 40000) for _ in range(rng.randrange(5, 60))] for _ in range(12)]
    out = []
    for _ in range(n):
        p = list(rng.choice(roots))
        if rng.random() < 0.7:
            p += rng.choice(mids)
        p += [rng.randrange(100, 40000) for _ in range(rng.randrange(1, 60))]
        out.append((p[:200], rng.randrange(1, 48)))
    return out


async def run_check(ns: argparse.Namespace) -> dict:
    log_dir = Path(tempfile.mkdtemp(prefix="scheduler-check-"))
    model = FakeModel(ns.kv, verify=True, host_capacity=ns.host_kv)
    server, mport = await start_fake_model(model)
    work = check_workload(ns.requests, ns.seed)
    host = ["--host-kv-tokens", str(ns.host_kv)] if ns.host_kv else []
    args = [
        *host,
        "--debug-invariants",
        "--chunk-tokens",
        str(ns.chunk),
        "--policy",
        ns.policy,
        "--radix",
        ns.radix,
        *ns.sched_arg,
    ]
    report: dict = {
        "test": "scheduler_check",
        "kv": ns.kv,
        "host_kv": ns.host_kv,
        "requests": ns.requests,
        "concurrency": ns.concurrency,
        "scheduler_args": args,
        "logs": str(log_dir),
    }
    t0 = time.perf_counter()
    try:
        async with scheduler_process(mport, args, log_dir) as (proc, port):
            fd = FrontDoor(f"127.0.0.1:{port}")
            await fd.open()
            try:
                sem = asyncio.Semaphore(ns.concurrency)
                last_progress = [time.monotonic()]

                abort_rng = random.Random(ns.seed + 1)
                aborts = {i for i in range(len(work)) if abort_rng.random() < ns.abort_frac}

                async def one(i: int, prompt: list[int], max_new: int) -> None:
                    async with sem:
                        t = fd.submit(f"c{i}", prompt, max_new)
                        if i in aborts:  # abort while waiting, prefilling or decoding
                            await asyncio.sleep(abort_rng.random() * 0.05)
                            fd.abort(f"c{i}")
                        await t.done.wait()
                        last_progress[0] = time.monotonic()

                async def watchdog() -> None:
                    while True:
                        await asyncio.sleep(1)
                        if proc.poll() is not None:
                            raise RuntimeError(f"scheduler died (code {proc.returncode})")
                        if time.monotonic() - last_progress[0] > ns.stall_s:
                            s = await fd.stats()
                            raise TimeoutError(
                                f"no request finished for {ns.stall_s} s: "
                                f"deadlock? stats: {str(s).replace(chr(10), ' ')}"
                            )

                tasks = [asyncio.create_task(one(i, p, m)) for i, (p, m) in enumerate(work)]
                dog = asyncio.create_task(watchdog())
                done_all = asyncio.ensure_future(asyncio.gather(*tasks))
                finished, _ = await asyncio.wait(
                    [dog, done_all], return_when=asyncio.FIRST_COMPLETED
                )  # type: ignore[type-var]
                if dog in finished:
                    for t in tasks:
                        t.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await done_all
                    report["error"] = repr(dog.exception())
                else:
                    dog.cancel()
                wrong = []
                for rid, tr in fd.reqs.items():
                    if not tr.done.is_set():
                        continue
                    want = expected_output(tr.prompt, tr.max_new)
                    if tr.finish == api_pb2.FINISH_REASON_ABORT:
                        want = want[: len(tr.tokens)]  # an aborted request: a prefix of it
                    if tr.error or tr.tokens != want:
                        wrong.append(
                            {
                                "rid": rid,
                                "error": tr.error,
                                "first_bad": next(
                                    (
                                        i
                                        for i, (a, b) in enumerate(
                                            zip(tr.tokens, want, strict=False)
                                        )
                                        if a != b
                                    ),
                                    min(len(tr.tokens), len(want)),
                                ),
                            }
                        )
                s = await fd.stats()
                agree, blocks = await cache_events_agree(fd, f"127.0.0.1:{port}")
                report.update(
                    {
                        "cache_events_agree": agree,
                        "cache_blocks_held": blocks,
                        "cache_host_blocks_held": sum(t == "host" for t in fd.held.values()),
                        "finished": sum(t.done.is_set() for t in fd.reqs.values()),
                        "wrong": len(wrong),
                        "wrong_examples": wrong[:5],
                        "violations": model.violations[:5],
                        "steps": s.steps,
                        "aborted": sum(
                            t.finish == api_pb2.FINISH_REASON_ABORT for t in fd.reqs.values()
                        ),
                        "cache_hit_rate": round(s.cache_hit_rate, 4),
                        "evicted_tokens": s.evicted_tokens,
                        "host_saved_tokens": s.host_saved_tokens,
                        "host_hit_tokens": s.host_hit_tokens,
                        "retractions": s.retractions,
                        "end_kv": {
                            "free": s.kv_free,
                            "evictable": s.kv_evictable,
                            "locked": s.kv_locked,
                            "request_owned": s.kv_request_owned,
                            "capacity": s.kv_capacity,
                        },
                        "scheduler_alive": proc.poll() is None,
                        "wall_s": round(time.perf_counter() - t0, 1),
                    }
                )
                report["ok"] = (
                    not wrong
                    and agree
                    and not model.violations
                    and "error" not in report
                    and report["finished"] == ns.requests
                    and s.kv_request_owned == 0
                    and s.kv_locked == 0
                    and s.kv_free + s.kv_evictable == s.kv_capacity
                )
            finally:
                await fd.close()
    finally:
        await server.stop(None)
    return report


# -- chunk-stall -------------------------------------------------------------------------------
async def run_chunk_stall(ns: argparse.Namespace) -> dict:
    """Known scheduler issue (docs/radix.md): a request mid-way through a chunked prefill is
    never retracted and retraction keeps one decoder, so when the two outgrow the pool the
    loop idles with both running. Pool 300, 4-token chunks, ratio decayed by 750 decode steps;
    a long decode, then a 240-token prompt. ``ok`` means both finished."""
    log_dir = Path(tempfile.mkdtemp(prefix="scheduler-stall-"))
    model = FakeModel(300, verify=True)
    server, mport = await start_fake_model(model)
    report: dict = {"test": "chunk_stall", "logs": str(log_dir)}
    try:
        async with scheduler_process(
            mport, ["--debug-invariants", "--chunk-tokens", "4"], log_dir
        ) as (_proc, port):
            fd = FrontDoor(f"127.0.0.1:{port}")
            await fd.open()
            try:
                for i in range(3):  # 750 decode steps: the new-token ratio reaches 0.1
                    await fd.submit(f"warm{i}", [50 + i], 250).done.wait()
                d = fd.submit("decoder", list(range(100, 120)), 270)
                while len(d.tokens) < 10:
                    await asyncio.sleep(0.001)
                c = fd.submit("chunked", list(range(1000, 1240)), 1)
                try:
                    await asyncio.wait_for(asyncio.gather(d.done.wait(), c.done.wait()), ns.stall_s)
                    report["ok"] = d.tokens == expected_output(
                        d.prompt, d.max_new
                    ) and c.tokens == expected_output(c.prompt, c.max_new)
                except asyncio.TimeoutError:
                    s = await fd.stats()
                    report.update(
                        ok=False,
                        stalled_s=ns.stall_s,
                        decoder_tokens=len(d.tokens),
                        chunked_tokens=len(c.tokens),
                        running=s.running_requests,
                        kv={
                            "free": s.kv_free,
                            "evictable": s.kv_evictable,
                            "locked": s.kv_locked,
                            "owned": s.kv_request_owned,
                        },
                    )
            finally:
                await fd.close()
    finally:
        await server.stop(None)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="load", choices=["load", "check", "chunk-stall"])
    p.add_argument("--running", type=int, nargs="+", default=[64, 256])
    p.add_argument("--waiting", type=int, default=1000)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--profile", action="store_true", help="py-spy top-10 of the scheduler")
    p.add_argument("--kv", type=int, default=700, help="check: KV capacity in tokens")
    p.add_argument("--host-kv", type=int, default=0, help="check: host KV tier tokens (0: off)")
    p.add_argument("--requests", type=int, default=300, help="check: requests")
    p.add_argument("--concurrency", type=int, default=24, help="check: requests in flight")
    p.add_argument("--chunk", type=int, default=64, help="check: --chunk-tokens")
    p.add_argument("--policy", default="lpm", help="check: --policy")
    p.add_argument("--radix", default="tree", help="check: --radix")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--abort-frac",
        type=float,
        default=0.1,
        help="check: fraction of requests aborted at a random moment",
    )
    p.add_argument("--stall-s", type=float, default=20.0)
    p.add_argument(
        "--sched-arg",
        action="append",
        default=[],
        help="extra scheduler flag (repeatable), e.g. --sched-arg=--policy=fcfs",
    )
    p.add_argument("--out", default="", help="also write the JSON here")
    ns = p.parse_args(argv)
    runner = {"load": run_load, "check": run_check, "chunk-stall": run_chunk_stall}[ns.mode]
    report = asyncio.run(runner(ns))
    text = json.dumps(report, indent=2)
    print(text)
    if ns.out:
        Path(ns.out).write_text(text)
    return 0 if report.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
