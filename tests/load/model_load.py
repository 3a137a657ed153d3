"""Load test for the model service alone (not part of CI's pass/fail timing).

The REAL model service runs as a process on a free port; this process is a FAKE scheduler speaking
the Steps stream (docs/architecture.md, Step protocol): open a session, one step admitting B
requests with random prompts (greedy, prompt length `--prompt-len`), then decode steps for all B. So
only the worker's costs count: step decoding, the forward pass, sampling, the reply, and the gRPC
hop. For each batch size and each pipelining depth it reports:

- steps/s and decode tok/s over the measured steps (after `--warmup` decode steps);
- step time p50/p99: the interval between consecutive results (what a scheduler sees), the
  round trip of each step (write -> its result) and the worker's `forward_ms` (launch to
  finish of the step on the worker; with 2 in flight that includes waiting for the step
  before it);
- the worker's own `step_burst` figures for exactly the measured steps (pauses isolate them):
  time per step inside the runner, host time between a step's finish and the next launch,
  and on CUDA the GPU's busy and idle time per step from CUDA events (`gpu_idle_fraction`);
- outside_worker_ms_per_step (1 in flight only): mean interval minus mean `forward_ms`, the
  transport and client time per step that pipelining can hide;
- tokens_match and speedup_vs_first_depth: with `--inflight 1,2` the greedy tokens of depth 2
  must equal depth 1's.

`--inflight 2` keeps two steps in flight: step N+1 is written before step N's result is read
(its decode inputs are resolved on the worker, which launches step N+1 while N runs).

    python tests/load/model_load.py                        # CPU: tiny-llama, batches 1,4,16
    python tests/load/model_load.py --model default --batches 1,8
    python tests/load/model_load.py --random-weights llama-3.1-8b --device cuda \\
        --batches 1,8,32,64,128,256 --prompt-len 128 --steps 64 --cuda-graph-max-bs 256

JSON on stdout (and `--out FILE`); the service's warnings and errors go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: this checkout's modules first

import grpc  # noqa: E402

from radixmesh_wire.packing import pack_i32, unpack_i32  # noqa: E402
from radixmesh_wire.pb import model_pb2, model_pb2_grpc  # noqa: E402
from services.launcher import check_ready, free_port  # noqa: E402

MAX_PROMPT_ID = 32000  # random prompt ids stay below every supported vocabulary's specials
BURST_PAUSE_S = 0.7  # longer than model_service.runner.BURST_IDLE_S (0.5 s): ends a burst
_KV = re.compile(r"(\w+)=([-\d.]+)(?=\s|$)")  # key=number in a structlog key-value line


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def service_command(ns: argparse.Namespace, port: int, kv_tokens: int) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "model_service",
        "--port",
        str(port),
        "--log-level",
        "info",
        "--device",
        ns.device,
        "--kv-tokens",
        str(kv_tokens),
    ]
    if ns.model:
        cmd += ["--model", ns.model]
    else:
        cmd += ["--random-weights", ns.random_weights]
    if ns.attention:
        cmd += ["--attention", ns.attention]
    if ns.threads:
        cmd += ["--threads", str(ns.threads)]
    if ns.cuda_graph_max_bs is not None:
        cmd += ["--cuda-graph-max-bs", str(ns.cuda_graph_max_bs)]
    return cmd


def sampling(seed: int) -> model_pb2.RequestSampling:
    return model_pb2.RequestSampling(
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        seed=seed,
        has_seed=True,
        prompt_logprobs_from=-1,
    )


def admit_step(prompts: list[list[int]], region: int) -> model_pb2.Step:
    """Step 0: admit every request, prompt KV at slots [i * region, i * region + len)."""
    step = model_pb2.Step(step_id=0)
    for i, p in enumerate(prompts):
        base = i * region
        step.admits.append(
            model_pb2.Admit(
                handle=i,
                sampling=sampling(i),
                input_ids=pack_i32(p),
                slots=pack_i32(range(base, base + len(p))),
                sample=True,
            )
        )
    return step


def decode_step(step_id: int, batch: int, region: int, pos: int) -> model_pb2.Step:
    """A decode for every request; its new token's KV goes to slot i * region + pos."""
    return model_pb2.Step(
        step_id=step_id,
        decode_handles=pack_i32(range(batch)),
        decode_slots=pack_i32(i * region + pos for i in range(batch)),
    )


def _result(reply: model_pb2.StepReply, want_id: int, batch: int) -> model_pb2.StepResult:
    if reply.WhichOneof("kind") != "result":
        raise RuntimeError(f"expected a step result, got {reply.WhichOneof('kind')}")
    res = reply.result
    if res.error:
        raise RuntimeError(f"step {res.step_id} failed on the worker: {res.error}")
    if res.step_id != want_id:
        raise RuntimeError(f"results out of order: got step {res.step_id}, want {want_id}")
    handles = unpack_i32(res.handles)
    if handles != list(range(batch)):
        raise RuntimeError(f"step {want_id}: {len(handles)} rows sampled, want {batch}")
    return res


class ServiceLog:
    """Reads the service's stderr on a thread: `step_burst` lines (the worker's own split of a
    burst of steps, model_service/runner.py) and `session_closed` markers go to a queue,
    warnings and errors are echoed."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.events: queue.Queue[dict[str, float] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode("utf-8", "replace")
            if "step_burst" in line:
                self.events.put({k: float(v) for k, v in _KV.findall(line)})
            elif "session_closed" in line:
                self.events.put(None)
            elif "level='info'" not in line:
                sys.stderr.write(line)

    def session_bursts(self, timeout: float = 30.0) -> list[dict[str, float]]:
        """The bursts logged up to the end of the next closed session, in order."""
        out: list[dict[str, float]] = []
        while True:
            try:
                ev = self.events.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError("the worker did not log the end of the session") from None
            if ev is None:
                return out
            out.append(ev)


async def run_decodes(
    call: Any,
    first: int,
    count: int,
    inflight: int,
    batch: int,
    ns: argparse.Namespace,
    vocab: int,
    tokens: list[list[int]],
) -> tuple[float, list[float], list[float], list[float]]:
    """Decode steps first..first+count-1, up to `inflight` written before a result is read.
    Returns (time the first was written, result times, round trips ms, worker forward_ms)."""
    region = ns.prompt_len + ns.warmup + ns.steps + 1
    pending: deque[tuple[int, float]] = deque()  # (step id, time written)
    done_at: list[float] = []
    rtt: list[float] = []
    fwd: list[float] = []
    first_sent = 0.0
    next_id = first
    while len(done_at) < count:
        while next_id < first + count and len(pending) < inflight:
            pos = ns.prompt_len + next_id - 1  # the KV of the token sampled by step next_id - 1
            await call.write(model_pb2.StepRequest(step=decode_step(next_id, batch, region, pos)))
            pending.append((next_id, time.perf_counter()))
            first_sent = first_sent or pending[-1][1]
            next_id += 1
        sid, sent = pending.popleft()
        res = _result(await call.read(), sid, batch)
        now = time.perf_counter()
        for i, t in enumerate(unpack_i32(res.tokens)):
            if not 0 <= t < vocab:
                raise RuntimeError(f"step {sid}: token {t} outside the vocabulary")
            tokens[i].append(t)
        done_at.append(now)
        rtt.append((now - sent) * 1e3)
        fwd.append(res.forward_ms)
    return first_sent, done_at, rtt, fwd


async def run_case(
    stub: model_pb2_grpc.ModelWorkerStub,
    batch: int,
    inflight: int,
    ns: argparse.Namespace,
    vocab: int,
    service_log: ServiceLog,
) -> dict[str, Any]:
    """Admit, `--warmup` decodes, a pause, the measured decodes, a pause, one more decode.
    The pauses end the worker's bursts (runner.BURST_IDLE_S), so its `step_burst` line for
    the measured steps holds exactly them; the last decode makes the worker log it."""
    rng = random.Random(1000 + batch)  # the same prompts at every depth for one batch size
    hi = min(vocab, MAX_PROMPT_ID)
    prompts = [[rng.randrange(100, hi) for _ in range(ns.prompt_len)] for _ in range(batch)]
    region = ns.prompt_len + ns.warmup + ns.steps + 1
    tokens: list[list[int]] = [[] for _ in range(batch)]
    call = stub.Steps()
    sid = f"load-b{batch}-d{inflight}"
    await call.write(model_pb2.StepRequest(open=model_pb2.OpenSession(session_id=sid)))
    opened = await call.read()
    if opened.WhichOneof("kind") != "opened":
        raise RuntimeError("the worker did not open the session")

    t0 = time.perf_counter()
    await call.write(model_pb2.StepRequest(step=admit_step(prompts, region)))
    res = _result(await call.read(), 0, batch)
    prefill_ms = (time.perf_counter() - t0) * 1e3
    prefill_fwd = res.forward_ms
    for i, t in enumerate(unpack_i32(res.tokens)):
        tokens[i].append(t)
    w, n = ns.warmup, ns.steps
    await run_decodes(call, 1, w, inflight, batch, ns, vocab, tokens)
    await asyncio.sleep(BURST_PAUSE_S)
    start, done_at, rtt, fwd = await run_decodes(call, w + 1, n, inflight, batch, ns, vocab, tokens)
    await asyncio.sleep(BURST_PAUSE_S)
    await run_decodes(call, w + n + 1, 1, 1, batch, ns, vocab, tokens)
    await call.done_writing()
    while await call.read() != grpc.aio.EOF:  # the worker ends the stream after our close
        pass
    # The last burst before the session ended is the measured steps, logged by the last
    # decode; a stall over the burst pause inside them (a loaded host) splits it: then the
    # figures cover only its last part, and `worker_burst_steps` says how many steps that is.
    bursts = service_log.session_bursts()
    burst = bursts[-1] if bursts else {}

    wall = done_at[-1] - start
    window = [start, *done_at]
    intervals = [(b - a) * 1e3 for a, b in zip(window[:-1], window[1:], strict=True)]
    mean_interval = wall * 1e3 / n
    out: dict[str, Any] = {
        "batch": batch,
        "inflight": inflight,
        "steps": n,
        "steps_per_s": round(n / wall, 2),
        "decode_tok_s": round(batch * n / wall, 1),
        "step_ms_p50": round(statistics.median(intervals), 3),
        "step_ms_p99": round(pct(intervals, 99), 3),
        "step_ms_mean": round(mean_interval, 3),
        "rtt_ms_p50": round(statistics.median(rtt), 3),
        "rtt_ms_p99": round(pct(rtt, 99), 3),
        "forward_ms_p50": round(statistics.median(fwd), 3),
        "forward_ms_p99": round(pct(fwd, 99), 3),
        "worker_burst_steps": int(burst.get("steps", 0)),
        "worker_busy_ms_per_step": burst.get("busy_ms_per_step"),
        "worker_between_ms_per_step": burst.get("between_ms_per_step"),
        "prefill_tokens": batch * ns.prompt_len,
        "prefill_ms": round(prefill_ms, 2),
        "prefill_forward_ms": round(prefill_fwd, 2),
        "_tokens": tokens,
    }
    if inflight == 1:  # forward_ms is the whole step only when steps do not overlap
        out["outside_worker_ms_per_step"] = round(mean_interval - statistics.fmean(fwd), 3)
    if burst.get("gpu_busy_ms_per_step"):
        out["gpu_busy_ms_per_step"] = burst["gpu_busy_ms_per_step"]
        out["gpu_idle_ms_per_step"] = burst["gpu_idle_ms_per_step"]
        out["gpu_idle_fraction"] = burst["gpu_idle_fraction"]
    return out


async def wait_ready(proc: subprocess.Popen[bytes], addr: str, timeout: float) -> float:
    t0 = time.monotonic()
    while not await check_ready(addr):
        if proc.poll() is not None:
            raise RuntimeError(
                f"the model service exited with code {proc.returncode} "
                "before it was ready (its log is above, on stderr)"
            )
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"the model service was not ready after {timeout:.0f} s")
        await asyncio.sleep(0.2)
    return time.monotonic() - t0


async def main_async(ns: argparse.Namespace) -> dict[str, Any]:
    batches = [int(x) for x in ns.batches.split(",") if x.strip()]
    depths = [int(x) for x in ns.inflight.split(",") if x.strip()]
    if not batches or not depths or min(batches + depths) < 1 or ns.steps < 2 or ns.warmup < 1:
        raise SystemExit(
            "--batches and --inflight need positive sizes, --steps at least 2, --warmup at least 1"
        )
    need = max(batches) * (ns.prompt_len + ns.warmup + ns.steps + 1)
    kv_tokens = ns.kv_tokens or need
    if kv_tokens < need:
        raise SystemExit(
            f"--kv-tokens {kv_tokens} is below the {need} slots the largest batch uses"
        )
    port = free_port()
    env = dict(os.environ)
    cmd = service_command(ns, port, kv_tokens)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    service_log = ServiceLog(proc.stderr)
    try:
        addr = f"127.0.0.1:{port}"
        ready_s = await wait_ready(proc, addr, ns.start_timeout)
        async with grpc.aio.insecure_channel(addr) as chan:
            stub = model_pb2_grpc.ModelWorkerStub(chan)
            info = await stub.GetWorkerInfo(model_pb2.WorkerInfoRequest())
            report: dict[str, Any] = {
                "bench": "model_load",
                "model": info.model_name,
                "device": info.device,
                "dtype": info.dtype,
                "attention_backend": info.attention_backend,
                "kv_capacity": info.kv_capacity,
                "cuda_graph_max_bs": (
                    str(ns.cuda_graph_max_bs)
                    if ns.cuda_graph_max_bs is not None
                    else env.get("RADIXMESH_CUDA_GRAPH_MAX_BS", "default")
                ),
                "prompt_len": ns.prompt_len,
                "warmup_steps": ns.warmup,
                "measured_steps": ns.steps,
                "cpu_count": os.cpu_count(),
                "service_ready_s": round(ready_s, 1),
                "service_args": cmd[3:],
                "cases": [],
            }
            for b in batches:
                first: dict[str, Any] | None = None
                for d in depths:
                    case = await run_case(stub, b, d, ns, info.vocab_size, service_log)
                    toks = case.pop("_tokens")
                    if first is None:
                        first = {**case, "_tokens": toks}
                    else:  # greedy: the pipelined run must produce the very same tokens
                        case["tokens_match"] = toks == first["_tokens"]
                        case["speedup_vs_first_depth"] = round(
                            case["decode_tok_s"] / first["decode_tok_s"], 3
                        )
                    report["cases"].append(case)
                    gpu = case.get("gpu_idle_fraction")
                    print(
                        f"batch {b:4d} inflight {d}: {case['decode_tok_s']:10.1f} tok/s, "
                        f"step p50 {case['step_ms_p50']:.2f} ms, worker busy "
                        f"{case['worker_busy_ms_per_step']:.2f} / between "
                        f"{case['worker_between_ms_per_step']:.2f} ms per step"
                        + (f", GPU idle {gpu:.3f}" if gpu is not None else ""),
                        file=sys.stderr,
                    )
            return report
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="", help="HF folder or 'default' (SmolLM2-135M)")
    p.add_argument(
        "--random-weights",
        default="tiny-llama",
        help="architecture with random weights, when --model is not given",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    p.add_argument("--attention", default="", help="reference, flashinfer or auto (default)")
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--inflight", default="1,2", help="steps kept in flight, comma-separated")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--warmup", type=int, default=4, help="decode steps not measured")
    p.add_argument("--steps", type=int, default=32, help="measured decode steps")
    p.add_argument("--kv-tokens", type=int, default=0, help="0: what the largest batch uses")
    p.add_argument(
        "--cuda-graph-max-bs",
        type=int,
        default=None,
        help="the service's --cuda-graph-max-bs (default: its own, 128)",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads of the service (CPU)")
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--out", default="", help="also write the JSON here")
    ns = p.parse_args(argv)
    report = asyncio.run(main_async(ns))
    text = json.dumps(report, indent=2)
    print(text)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
