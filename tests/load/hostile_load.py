"""Hostile-traffic load test (issue 12): mixed valid and hostile requests against a real stack.

Starts the default CPU stack (every service a process), then runs two phases of `--seconds`
each with `--healthy` client threads sending short healthy requests (greedy, 8 tokens):

- baseline: healthy traffic only;
- hostile: the same healthy traffic plus `--hostile` threads cycling through hostile requests:
  public ones (empty prompt, ids out of range, non-finite temperature, oversized max_new_tokens,
  an invalid regex and schema, a 2,000-token prompt, a duplicate request id, a request cancelled
  by a 0.3 s deadline, an abort of a running request) and internal ones sent straight to the
  scheduler's Session stream (empty input_ids, an id of 10**6, a stop id of 10**6 with
  min_new_tokens, a prompt beyond the context window).

Reports requests tried, the statuses each kind got (INTERNAL/UNKNOWN count as failures),
healthy latency p50/p99 in both phases, and each service's peak resident memory (VmHWM from
/proc) against the bounds in docs/architecture.md ("Memory bounds").

    python tests/load/hostile_load.py --seconds 60 --out results/hostile_load.json

JSON on stdout (and `--out FILE`); exit status 1 if a bound or a status check fails.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from radixmesh.api import Client, RadixMeshError

from radixmesh_wire.pb import api_pb2, scheduler_pb2
from services.launcher import Launcher
from tests.conftest import start_stack
from tests.integration.raw_peers import SchedulerSession, channel_as

# Peak resident memory per service under this test's load, MiB (docs/architecture.md).
MEMORY_BOUND_MIB = {"model": 3072, "scheduler": 1024, "tokenizer": 1024, "grammar": 2048}
BAD = {"INTERNAL", "UNKNOWN"}


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 3)


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: dict[str, Counter[str]] = {}
        self.healthy: list[float] = []
        self.work: dict[str, float] = {}

    def status(self, kind: str, code: str) -> None:
        with self.lock:
            self.statuses.setdefault(kind, Counter())[code] += 1


def _call(rec: Recorder, kind: str, fn: Callable[[], Any]) -> None:
    try:
        fn()
        rec.status(kind, "OK")
    except RadixMeshError as exc:
        rec.status(kind, exc.code.name)
    except grpc.RpcError as exc:
        rec.status(kind, exc.code().name)
    except TimeoutError:
        rec.status(kind, "NO_ANSWER")


def healthy_loop(endpoint: str, rec: Recorder, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    with Client(endpoint, timeout=120) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                c.generate(
                    f"{rng.randrange(10**6)} The capital of France is",
                    max_new_tokens=8,
                    temperature=0,
                    ignore_eos=True,
                )
                with rec.lock:
                    rec.healthy.append(time.perf_counter() - t0)
                rec.status("healthy", "OK")
            except RadixMeshError as exc:
                rec.status("healthy", exc.code.name)


def _public(endpoint: str) -> list[tuple[str, Callable[..., Any]]]:
    def gen(**kw: Any) -> Callable[[Client], Any]:
        return lambda c: c.generate(**kw)

    def long_prompt(c: Client) -> None:
        ids = [random.randrange(100, 40000) for _ in range(2000)]
        c.generate(input_ids=ids, max_new_tokens=2, temperature=0)

    def duplicate(c: Client) -> None:
        rid = f"dup-{random.randrange(10**9)}"
        it = c.stream("Tell me a story.", max_new_tokens=40, ignore_eos=True, request_id=rid)
        next(it)
        try:
            c.generate("hi", max_new_tokens=2, request_id=rid)
        finally:
            c.abort(rid)
            list(it)

    def deadline(c: Client) -> None:
        with Client(endpoint, timeout=0.3) as short:
            short.generate("Write an essay.", max_new_tokens=200, ignore_eos=True)

    def abort_running(c: Client) -> None:
        rid = f"ab-{random.randrange(10**9)}"
        it = c.stream("Describe the sea.", max_new_tokens=200, ignore_eos=True, request_id=rid)
        next(it)
        c.abort(rid)
        list(it)

    return [
        ("empty_prompt", gen(prompt="")),
        ("id_out_of_range", gen(input_ids=[1, 2, 10**7])),
        ("temperature_inf", gen(prompt="hi", temperature=float("inf"))),
        ("max_new_tokens_huge", gen(prompt="hi", max_new_tokens=10**6)),
        ("bad_regex", gen(prompt="hi", regex="(", max_new_tokens=2)),
        ("bad_schema", gen(prompt="hi", json_schema='{"type": "nope"}', max_new_tokens=2)),
        ("regex_min_new_tokens", gen(prompt="n:", regex="[0-9]{2}", min_new_tokens=5)),
        ("long_prompt_2000", long_prompt),
        ("duplicate_id", duplicate),
        ("deadline_0.3s", deadline),
        ("abort_running", abort_running),
    ]


def _internal(context: int) -> list[tuple[str, scheduler_pb2.SubmitRequest]]:
    def sub(ids: list[int], **kw: Any) -> scheduler_pb2.SubmitRequest:
        s = api_pb2.SamplingParams(max_new_tokens=2, temperature=0)
        for k, v in kw.items():
            if isinstance(v, list):
                getattr(s, k).extend(v)
            else:
                setattr(s, k, v)
        return scheduler_pb2.SubmitRequest(input_ids=ids, sampling=s, eos_token_ids=[2])

    return [
        ("internal_empty_input", sub([])),
        ("internal_id_1e6", sub([1, 10**6])),
        ("internal_stop_id_1e6", sub([1, 2], stop_token_ids=[10**6], min_new_tokens=1)),
        ("internal_beyond_context", sub([1] * (context + 1), max_new_tokens=0)),
    ]


def hostile_loop(
    endpoint: str, launcher: Launcher, rec: Recorder, stop: threading.Event, worker: int
) -> None:
    sess = SchedulerSession(channel_as(launcher, "scheduler", "tokenizer"))
    keys = itertools.count(1)
    public = _public(endpoint)
    internal = _internal(sess.hello.context_length)
    order = [("public", k, f) for k, f in public] + [("internal", k, m) for k, m in internal]
    random.Random(worker).shuffle(order)
    try:
        with Client(endpoint, timeout=120) as c:
            for where, kind, what in itertools.cycle(order):
                if stop.is_set():
                    break
                if where == "public":
                    _call(rec, kind, functools.partial(what, c))
                    continue
                key = next(keys)
                msg = scheduler_pb2.SubmitRequest()
                msg.CopyFrom(what)
                msg.key, msg.rid = key, f"h{worker}-{key}"
                sess.submit(msg)
                try:
                    out = sess.wait(key, timeout=60)
                    rec.status(kind, out.error_code.name if out.error_code else "OK")
                except TimeoutError:
                    rec.status(kind, "NO_ANSWER")
    finally:
        sess.close()


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return round(kb / 1024, 1)


def _work(endpoint: str) -> dict[str, float]:
    with Client(endpoint) as c:
        s = c.stats()
    return {
        "steps": s.steps,
        "prompt_tokens": s.prompt_tokens,
        "cached_prompt_tokens": s.cached_prompt_tokens,
        "generated_tokens": s.generated_tokens,
    }


def run_phase(
    endpoint: str, launcher: Launcher, seconds: float, healthy: int, hostile: int
) -> Recorder:
    """One phase; `rec.work` is what the scheduler did meanwhile (steps, tokens computed)."""
    rec = Recorder()
    before = _work(endpoint)
    stop = threading.Event()
    threads = [
        threading.Thread(target=healthy_loop, args=(endpoint, rec, stop, i)) for i in range(healthy)
    ]
    threads += [
        threading.Thread(target=hostile_loop, args=(endpoint, launcher, rec, stop, i))
        for i in range(hostile)
    ]
    for t in threads:
        t.start()
    time.sleep(seconds)  # the phase's duration (a workload length, not a synchronisation)
    stop.set()
    for t in threads:
        t.join()
    after = _work(endpoint)
    rec.work = {k: after[k] - before[k] for k in after}
    return rec


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=120.0, help="length of each phase")
    p.add_argument("--healthy", type=int, default=2, help="healthy client threads")
    p.add_argument("--hostile", type=int, default=2, help="hostile client threads")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hostile-"))
    with contextmanager(start_stack)(tmp, ["--kv-tokens", "16384"], []) as stack:
        base = run_phase(stack.endpoint, stack.launcher, a.seconds, a.healthy, 0)
        hostile = run_phase(stack.endpoint, stack.launcher, a.seconds, a.healthy, a.hostile)
        alive = {n: p.poll() is None for n, p in stack.launcher.procs.items()}
        rss = {n: peak_rss_mib(p.pid) for n, p in stack.launcher.procs.items() if alive[n]}
        restarts = dict(stack.launcher.restarts)
    tried = sum(sum(c.values()) for c in hostile.statuses.values())
    bad = {k: dict(c) for k, c in hostile.statuses.items() if BAD & set(c) or "NO_ANSWER" in c}
    over = {n: v for n, v in rss.items() if v > MEMORY_BOUND_MIB[n]}
    report = {
        "seconds_per_phase": a.seconds,
        "healthy_threads": a.healthy,
        "hostile_threads": a.hostile,
        "requests_tried_hostile_phase": tried,
        "requests_tried_baseline_phase": sum(sum(c.values()) for c in base.statuses.values()),
        "statuses": {k: dict(c) for k, c in sorted(hostile.statuses.items())},
        "healthy_latency_s": {
            "baseline": {
                "n": len(base.healthy),
                "p50": _pct(base.healthy, 0.5),
                "p99": _pct(base.healthy, 0.99),
            },
            "hostile": {
                "n": len(hostile.healthy),
                "p50": _pct(hostile.healthy, 0.5),
                "p99": _pct(hostile.healthy, 0.99),
            },
        },
        "scheduler_work": {"baseline": base.work, "hostile": hostile.work},
        "peak_rss_mib": rss,
        "memory_bound_mib": MEMORY_BOUND_MIB,
        "services_alive": alive,
        "restarts": restarts,
        "failures": {"bad_statuses": bad, "over_memory_bound": over},
    }
    text = json.dumps(report, indent=2)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    failed = bad or over or not all(alive.values()) or any(restarts.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
