"""Drive a workload through the public gRPC API (radixmesh.api.Client), spread over the front
doors, at most `concurrency` requests in flight, and record each response's own figures.

Spreading over M front doors the way a per-request load balancer would: static request i goes
to front door i % M; turn t of conversation s to front door (s + t) % M, so consecutive turns
of one conversation cross front doors (the hard case for routing on shared cache state).
Every request is greedy with `ignore_eos`, so output lengths are exactly `max_new_tokens`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from radixmesh.api import Client, RadixMeshError

from radixmesh_bench.radix_workloads import Workload
from radixmesh_bench.router_report import Outcome
from radixmesh_bench.router_workloads import ID_RANGE
from radixmesh_bench.stack import timed_stream

REQUEST_TIMEOUT_S = 600.0


def _one(c: Client, ids: list[int], max_new: int) -> tuple[Outcome, list[int]]:
    """(outcome, output ids); a refused request is an outcome with its status and message."""
    try:
        t = timed_stream(c, input_ids=ids, max_new_tokens=max_new, temperature=0.0, ignore_eos=True)
    except RadixMeshError as exc:
        return Outcome(len(ids), 0, 0, 0.0, 0.0, f"{exc.code.name}: {exc.message}"), []
    r = t.result
    return (
        Outcome(r.prompt_tokens, r.cached_tokens, r.completion_tokens, t.latency_s, t.ttft_s),
        r.output_ids,
    )


def drive(endpoints: Sequence[str], w: Workload, concurrency: int) -> tuple[list[Outcome], float]:
    """Run every request of `w`; returns (outcomes in submission order, wall seconds)."""
    clients = [Client(ep, timeout=REQUEST_TIMEOUT_S) for ep in endpoints]
    try:
        t0 = time.perf_counter()
        if not w.is_chat:
            with ThreadPoolExecutor(max(1, min(concurrency, len(w.prompts)))) as pool:
                outs = list(
                    pool.map(
                        lambda i: _one(clients[i % len(clients)], w.prompts[i], w.max_new)[0],
                        range(len(w.prompts)),
                    )
                )
            return outs, time.perf_counter() - t0

        def conversation(s: int) -> list[Outcome]:
            first, followups = w.sessions[s]
            prompt, done = list(first), []
            for t in range(len(followups) + 1):
                out, ids = _one(clients[(s + t) % len(clients)], prompt, w.max_new)
                done.append(out)
                if out.error:
                    break  # the conversation cannot go on without this answer
                if t < len(followups):
                    prompt = prompt + ids + followups[t]
            return done

        with ThreadPoolExecutor(max(1, min(concurrency, len(w.sessions)))) as pool:
            turns = list(pool.map(conversation, range(len(w.sessions))))
        return [o for conv in turns for o in conv], time.perf_counter() - t0
    finally:
        for c in clients:
            c.close()


def wait_all_serving(endpoints: Sequence[str], replicas: int, timeout_s: float = 60.0) -> None:
    """Until every front door sees every replica connected and serving: the launcher's
    readiness says each service is up, but a front door learns a replica's model is connected
    from its own probe, and a run started before that would route around the replica."""
    deadline = time.monotonic() + timeout_s
    for ep in endpoints:
        with Client(ep, timeout=5.0) as c:
            while True:
                rs = c.stats().replicas
                if len(rs) == replicas and all(r.connected and r.serving for r in rs):
                    break
                if time.monotonic() > deadline:
                    seen = [(r.address, r.connected, r.serving) for r in rs]
                    raise RuntimeError(
                        f"front door {ep} does not see every replica serving: {seen}"
                    )
                time.sleep(0.05)


def warm_up(endpoints: Sequence[str], replicas: int, seed: int = 12345) -> int:
    """A few short requests of fresh ids through every front door (first-call costs: channels,
    lazy torch set-up), 2 per replica per front door; returns how many were sent. They share
    nothing with any workload, and the report counts only the measured run."""
    import random

    rng = random.Random(seed)
    lo, hi = ID_RANGE
    n = 2 * replicas * len(endpoints)
    prompts = [[rng.randrange(lo, hi) for _ in range(8)] for _ in range(n)]
    w = Workload("warm_up", 2, prompts=prompts)
    outs, _ = drive(endpoints, w, n)
    failed = [o.error for o in outs if o.error]
    if failed:
        raise RuntimeError(f"warm-up requests failed: {failed[:3]}")
    return n
