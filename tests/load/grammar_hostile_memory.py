"""Resident memory of a real grammar service process under hostile grammars (issue 12).

Starts `python -m grammar_service` (default flags unless given after `--`), then for
`--seconds` keeps sending, from several concurrent clients:
- the recursive schema whose forced continuation never ends, bound to a Masks session and
  stepped with jump-forward on (before the fix: unbounded growth to OOM);
- the multibyte-choice regex, walked with jump-forward;
- slow schemas (60 bounded strings) with a 2 s client deadline (cancelled compiles);
- memory-hungry repetitions (`[a-z]{1,N}`) that hit the compile memory or time bound;
- distinct small regexes (cache churn, bounded by --max-cache-bytes);
and samples the resident memory of the service and of its compile workers every 0.2 s.

    python tests/load/grammar_hostile_memory.py --seconds 60 [-- --compile-memory-mb 512]

Prints JSON: requests by outcome, peak RSS (service, workers, sum) and the final RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from radixmesh_wire.mask_step import MaskStepBuilder, grammar_spec  # noqa: E402
from radixmesh_wire.pb import grammar_pb2 as pb  # noqa: E402
from radixmesh_wire.pb import grammar_pb2_grpc as pb_grpc  # noqa: E402

RECURSIVE = (
    '{"$ref":"#/$defs/n","$defs":{"n":{"type":"object","properties":'
    '{"next":{"$ref":"#/$defs/n"}},"required":["next"]}}}'
)
HOUSES = "(格兰芬多|赫奇帕奇|拉文克劳|斯莱特林)"


def slow_schema(n: int, tag: str) -> str:
    props = {f"{tag}{i}": {"type": "string", "maxLength": 8 + i} for i in range(n)}
    return json.dumps({"type": "object", "properties": props, "required": list(props)})


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True)
    kids: dict[int, list[int]] = {}
    pairs = [tuple(map(int, ln.split())) for ln in out.stdout.strip().splitlines()]
    for p, pp in pairs:
        kids.setdefault(pp, []).append(p)
    found, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            found.append(k)
            todo.append(k)
    return found


async def sampler(pid: int, stop: asyncio.Event, peaks: dict[str, float]) -> None:
    while not stop.is_set():
        svc = rss_mb(pid)
        workers = sum(rss_mb(k) for k in descendants(pid))
        peaks["service"] = max(peaks.get("service", 0.0), svc)
        peaks["workers"] = max(peaks.get("workers", 0.0), workers)
        peaks["total"] = max(peaks.get("total", 0.0), svc + workers)
        await asyncio.sleep(0.2)


async def masks_walk(stub: pb_grpc.GrammarStub, kind: str, text: str, steps: int) -> str:
    """Bind, then step with jump-forward, accepting each proposal (or the first allowed id)."""
    call = stub.Masks()
    await call.write(pb.MaskRequest(open=pb.OpenMasks(session_id="hostile")))
    await call.read()
    b = MaskStepBuilder()
    b.bind(1, kind, text)
    b.want(1, jump_forward=True)
    outcome = "ok"
    for sid in range(1, steps + 1):
        await call.write(pb.MaskRequest(step=b.build(sid)))
        res = (await call.read()).result
        if res.errors:
            outcome = f"row_error:{res.errors[0].code}"
            break
        row = res.rows[0]
        b = MaskStepBuilder()
        toks = row.jump_forward.tokens
        if not toks or row.terminated:
            break
        if row.jump_forward.rollback:
            b.rollback(1, row.jump_forward.rollback)
        b.accept(1, list(memoryview(toks).cast("i")))
        b.want(1, jump_forward=True)
    await call.done_writing()
    return outcome


async def client(port: int, n: int, deadline: float, outcomes: Counter[str]) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = pb_grpc.GrammarStub(ch)
        i = 0
        while time.monotonic() < deadline:
            i += 1
            pick = (n + i) % 5
            try:
                if pick == 0:
                    outcomes[
                        "recursive_walk:" + await masks_walk(stub, "json_schema", RECURSIVE, 8)
                    ] += 1
                elif pick == 1:
                    outcomes["multibyte_walk:" + await masks_walk(stub, "regex", HOUSES, 8)] += 1
                elif pick == 2:
                    spec = grammar_spec("json_schema", slow_schema(60, f"c{n}x{i}"))
                    await stub.Compile(pb.CompileRequest(grammar=spec), timeout=2)
                    outcomes["slow_schema:finished"] += 1
                elif pick == 3:
                    spec = grammar_spec("regex", f"[a-z]{{1,{20_000 + i}}}")
                    r = await stub.Compile(pb.CompileRequest(grammar=spec), timeout=60)
                    why = "ok" if r.ok else r.error.split(",")[0][:40]
                    outcomes[f"repetition:{why}"] += 1
                else:
                    spec = grammar_spec("regex", f"(ab|cd){{{i % 50}}}x{n}y{i}")
                    r = await stub.Compile(pb.CompileRequest(grammar=spec), timeout=30)
                    outcomes[f"small:{'ok' if r.ok else 'error'}"] += 1
            except grpc.aio.AioRpcError as exc:
                outcomes[f"status:{exc.code().name}"] += 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def main(ns: argparse.Namespace, extra: list[str]) -> dict:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'client'}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "grammar_service", "--port", str(port), *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            await asyncio.wait_for(ch.channel_ready(), 120)
        base = rss_mb(proc.pid)
        stop = asyncio.Event()
        peaks: dict[str, float] = {}
        outcomes: Counter[str] = Counter()
        sample = asyncio.create_task(sampler(proc.pid, stop, peaks))
        deadline = time.monotonic() + ns.seconds
        await asyncio.gather(*(client(port, n, deadline, outcomes) for n in range(ns.clients)))
        stop.set()
        await sample
        return {
            "seconds": ns.seconds,
            "clients": ns.clients,
            "flags": extra,
            "requests": sum(outcomes.values()),
            "outcomes": dict(sorted(outcomes.items())),
            "rss_mb_at_start": round(base, 1),
            "peak_rss_mb": {k: round(v, 1) for k, v in peaks.items()},
            "final_rss_mb": round(rss_mb(proc.pid), 1),
            "service_alive": proc.poll() is None,
        }
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=4)
    ns = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    print(json.dumps(asyncio.run(main(ns, extra)), indent=2, ensure_ascii=False))
