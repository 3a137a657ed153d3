"""Chaos load test (issue 13): minutes of mixed load while every service is killed in turn.

    python -m tests.load.chaos [--rounds 2] [--load-s 15] [--workers 8] [--json out.json]

Starts its own stack (real processes, free ports, the default model on CPU; the scheduler
checks its KV invariant after every step), computes an undisturbed reference for every request
template, then runs `--workers` client threads streaming the templates round-robin (plain seeded
sampling, a shared 700-token prefix, chat, stop strings, JSON schema, regex; jump-forward is
on). Every `--load-s` seconds one service gets `kill -9` (tokenizer, scheduler, model, grammar,
repeated `--rounds` times); the launcher restarts it. After each kill the load pauses until the
stack is idle, so the KV accounting is read with nothing running ("slots after drain").

Per kill, the JSON report has: requests in flight at the kill, how many completed identical to
the reference (token ids; `text_identical` counts the ones whose text matched although token
ids differed: a client-side resume after jump-forward retokenization), failed (by status),
hung (no answer 30 s past their deadline), recovery seconds (kill -> every service ready and a
probe request served), and the scheduler's slot accounting after the drain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixmesh.api import Client, GenerateResult, RadixMeshError

from radixmesh_bench.stack import model_source
from services.launcher import Launcher, StackPorts, check_ready, stack_specs
from services.model_store import resolve_model

SERVICES = ["tokenizer", "scheduler", "model", "grammar"]
PREFIX = "You are a meticulous assistant. " + " ".join(
    f"Rule {i}: answer briefly, cite facts, and never invent numbers." for i in range(70)
)
SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
)
TEMPLATES: list[dict[str, Any]] = [
    {"prompt": "Once upon a time", "temperature": 0.8, "seed": 7, "max_new_tokens": 24},
    {"prompt": PREFIX + " Q: What is 2+2?", "temperature": 0, "max_new_tokens": 16},
    {"prompt": PREFIX + " Q: Name a color.", "temperature": 0, "max_new_tokens": 16},
    {
        "messages": [{"role": "user", "content": "Say hello in French."}],
        "temperature": 0,
        "max_new_tokens": 16,
    },
    {"prompt": "Count: one, two, three,", "temperature": 0, "stop": [" six"], "max_new_tokens": 24},
    {"prompt": "A person as JSON:", "json_schema": SCHEMA, "temperature": 0, "max_new_tokens": 40},
    {
        "prompt": "A US phone number:",
        "regex": r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
        "temperature": 0.7,
        "seed": 3,
        "max_new_tokens": 20,
    },
    {"prompt": "def add(a, b):", "temperature": 0.6, "seed": 11, "top_k": 20, "max_new_tokens": 24},
]
DEADLINE_S = 120.0


@dataclass
class Outcome:
    template: int
    start: float
    end: float = 0.0
    result: GenerateResult | None = None
    status: str = ""  # gRPC status name when it failed
    message: str = ""


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    go: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    active: int = 0


def _worker(endpoint: str, run: Run, wid: int) -> None:
    i = wid
    with Client(endpoint, timeout=DEADLINE_S) as c:
        while not run.stop.is_set():
            if not run.go.wait(0.2):
                continue
            t = i % len(TEMPLATES)
            i += 1
            o = Outcome(t, time.monotonic())
            with run.lock:
                run.outcomes.append(o)
                run.active += 1
            kw = dict(TEMPLATES[t])
            try:
                for item in c.stream(kw.pop("prompt", None), **kw):
                    if isinstance(item, GenerateResult):
                        o.result = item
            except RadixMeshError as exc:
                o.status, o.message = exc.code.name, exc.message
            o.end = time.monotonic()
            with run.lock:
                run.active -= 1


def _ready_all(launcher: Launcher) -> bool:
    async def check() -> bool:
        oks = await asyncio.gather(*(check_ready(s.address) for s in launcher.specs.values()))
        return all(oks)

    return asyncio.run(check())


def _wait(cond, timeout: float, step: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return bool(cond())


def _recovered(launcher: Launcher, endpoint: str, since: float, timeout: float = 180.0) -> float:
    """Seconds from `since` until every service is ready and a probe request is served."""

    def probe() -> bool:
        if not _ready_all(launcher):
            return False
        try:
            with Client(endpoint, timeout=10) as c:
                return c.generate("Hi", max_new_tokens=1).completion_tokens == 1
        except RadixMeshError:
            return False

    if not _wait(probe, timeout, 0.2):
        return -1.0
    return round(time.monotonic() - since, 2)


def _drain_stats(endpoint: str, run: Run) -> dict[str, int]:
    run.go.clear()
    _wait(lambda: run.active == 0, DEADLINE_S + 30)
    with Client(endpoint, timeout=10) as c:
        _wait(lambda: c.stats().running_requests == 0 and c.stats().queue_length == 0, 30)
        s = c.stats()
    return {
        "running": s.running_requests,
        "queued": s.queue_length,
        "kv_request_owned": s.kv_request_owned,
        "kv_locked": s.kv_locked,
        "kv_free_plus_evictable": s.kv_free + s.kv_evictable,
        "kv_capacity": s.kv_capacity,
    }


def _judge(o: Outcome, refs: list[GenerateResult]) -> str:
    if o.result is None:
        return "hung" if not o.status else "failed"
    ref = refs[o.template]
    if o.result.output_ids == ref.output_ids:
        return "identical"
    return "text_identical" if o.result.text == ref.text else "different"


def _detail(o: Outcome, refs: list[GenerateResult]) -> dict[str, Any]:
    """What went wrong with one request, for the report."""
    out: dict[str, Any] = {"template": o.template, "verdict": _judge(o, refs)}
    if o.status:
        out.update(status=o.status, message=o.message[:200])
    if o.result is not None:
        ref = refs[o.template].output_ids
        got = o.result.output_ids
        pairs = enumerate(zip(got, ref, strict=False))
        first = next((i for i, (a, b) in pairs if a != b), min(len(got), len(ref)))
        out.update(first_difference=first, got_len=len(got), ref_len=len(ref))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--load-s", type=float, default=15.0, help="load before each kill")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--kv-tokens", type=int, default=16384)
    ap.add_argument("--json", default="", help="write the report here too")
    ap.add_argument("--services", default=",".join(SERVICES), help="killed in turn, each round")
    ap.add_argument("--random-weights", default="", help="GPU run: a random shape (llama-3.1-8b)")
    ap.add_argument("--device", default="cuda", help="with --random-weights")
    ns = ap.parse_args(argv)
    victims = [v for v in ns.services.split(",") if v]
    if not set(victims) <= set(SERVICES):
        ap.error(f"--services: choose among {', '.join(SERVICES)}")
    model, model_args = model_source("default", ns.random_weights, ns.device, ns.kv_tokens)
    if ns.random_weights and ns.device.startswith("cuda"):
        model_args += ["--attention", "flashinfer"]
    else:
        resolve_model("default")
    log_dir = Path(tempfile.mkdtemp(prefix="radixmesh-chaos-"))
    ports = StackPorts.free()
    launcher = Launcher(
        stack_specs(
            ports,
            model,
            model_args=model_args,
            scheduler_args=["--debug-invariants", "--model-probe-s", "0.5"],
        ),
        log_dir=log_dir,
        max_backoff=0.5,
    )
    endpoint = f"127.0.0.1:{ports.tokenizer}"
    launcher.start_all()
    loop = asyncio.new_event_loop()
    sup = threading.Thread(target=loop.run_until_complete, args=(launcher.supervise(),))
    run = Run()
    kills: list[dict[str, Any]] = []
    try:
        asyncio.run(launcher.wait_ready(timeout=600))
        sup.daemon = True
        sup.start()
        with Client(endpoint, timeout=DEADLINE_S) as c:
            refs = []
            for t in TEMPLATES:
                kw = dict(t)
                refs.append(c.generate(kw.pop("prompt", None), **kw))
        workers = [
            threading.Thread(target=_worker, args=(endpoint, run, w), daemon=True)
            for w in range(ns.workers)
        ]
        for w in workers:
            w.start()
        for rnd in range(ns.rounds):
            for victim in victims:
                run.go.set()
                time.sleep(ns.load_s)
                with run.lock:
                    in_flight = [o for o in run.outcomes if o.end == 0.0]
                t_kill = time.monotonic()
                launcher.kill(victim, signal.SIGKILL)
                recovery = _recovered(launcher, endpoint, t_kill)
                slots = _drain_stats(endpoint, run)
                verdicts = Counter(_judge(o, refs) for o in in_flight)
                statuses = Counter(o.status for o in in_flight if o.status)
                report = {
                    "round": rnd,
                    "killed": victim,
                    "in_flight": len(in_flight),
                    "completed_identical": verdicts["identical"],
                    "completed_text_identical": verdicts["text_identical"],
                    "completed_different": verdicts["different"],
                    "failed": dict(statuses),
                    "hung": verdicts["hung"],
                    "recovery_s": recovery,
                    "slots_after_drain": slots,
                    "not_identical": [
                        _detail(o, refs) for o in in_flight if _judge(o, refs) != "identical"
                    ],
                }
                kills.append(report)
                print(json.dumps(report), flush=True)
        run.stop.set()
        for w in workers:
            w.join(DEADLINE_S + 30)
        all_verdicts = Counter(_judge(o, refs) for o in run.outcomes)
        summary = {
            "model": ns.random_weights or "default",
            "device": ns.device if ns.random_weights else "cpu",
            "workers": ns.workers,
            "requests": len(run.outcomes),
            "verdicts": dict(all_verdicts),
            "failed": dict(Counter(o.status for o in run.outcomes if o.status)),
            "kills": kills,
            "logs": str(log_dir),
        }
        print(json.dumps({k: v for k, v in summary.items() if k != "kills"}), flush=True)
        if ns.json:
            Path(ns.json).write_text(json.dumps(summary, indent=2))
    finally:
        run.stop.set()
        launcher.stop_all()
    lost = sum(sum(k["failed"].values()) + k["hung"] + k["completed_different"] for k in kills)
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
