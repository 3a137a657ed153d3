"""The scheduler's own CPU per step, in this process (part `scheduler` of `radixmesh bench
step-cost`).

A real `Scheduler` (its config's defaults: radix tree, cache events on, overlap on) is connected
to a model that answers at once, and this module runs its step cycle as `Scheduler._steps` does
with two steps in flight: build step N+1 and encode it onto the wire, then read step N's result
off the wire, apply it and flush every session's output through the front-door link's
conversion (`batch_to_proto`) to bytes. No gRPC and no event loop: what is left is the
scheduler's Python per step, split by phase, so a regression shows as a number. The fake
model's own work (parsing the step, building the reply's bytes) is outside the timers.

`running` requests decode (prompts of PROMPT tokens, `ignore_eos`, an output budget beyond
the run) with `waiting` more queued behind `max_running` (a backlog as in a rate-inf serving
benchmark); the KV pool is sized so that nothing is retracted.

The process-level figure over gRPC (the scheduler as a process against a fake model service)
is `tests/load/scheduler_load.py`; `--process` runs it from a checkout of the repository.
"""

from __future__ import annotations

import random
import time
from collections import deque
from typing import Any

from radixmesh_wire.packing import pack_i32, unpack_i32
from radixmesh_wire.pb import model_pb2
from radixmesh_wire.step_codec import decode_output, encode_step
from radixmesh_wire.step_ops import Sampling, WorkerInfo
from scheduler_service.config import SchedulerConfig
from scheduler_service.links.frontend import batch_to_proto
from scheduler_service.planner.batch_builder import PlannedStep
from scheduler_service.planner.output_processor import apply_result
from scheduler_service.request import Request
from scheduler_service.scheduler import Scheduler
from scheduler_service.sessions.outbox import Batch

PROMPT = 128
VOCAB = 128_256
PHASES = ("build", "encode", "decode", "apply", "flush")


def _reply_bytes(step: bytes) -> bytes:
    """The fake model: one token per sampling row (sampling admits and extends, then every
    decode), as the worker orders them."""
    msg = model_pb2.StepRequest.FromString(step).step
    head = [a.handle for a in msg.admits if a.sample] + [e.handle for e in msg.extends if e.sample]
    handles = unpack_i32(msg.decode_handles)
    rows = head + handles
    res = model_pb2.StepResult(
        step_id=msg.step_id,
        handles=pack_i32(rows),
        tokens=pack_i32([1000 + (h * 7919) % 30000 for h in rows]),
        logprobs=b"\x00\x00\x00\x00" * len(rows),
    )
    return model_pb2.StepReply(result=res).SerializeToString()


class SchedulerDriver:
    """One connected scheduler and its step cycle, timed by phase (thread CPU seconds)."""

    def __init__(self, running: int, waiting: int, steps: int, seed: int = 0) -> None:
        cfg = SchedulerConfig(max_running=running, max_queue=running + waiting + 16)
        self.sched = Scheduler(cfg)
        max_new = steps + 64  # never reached: the batch stays whole
        capacity = (running + waiting) * (PROMPT + 8) + running * max_new
        info = WorkerInfo("bench", capacity, 1 << 20, VOCAB, False, (2,), "cuda")
        self.sched.model.connected(info)
        self.wire_bytes = 0  # to the front door, per flush
        self.sched.open_session("bench", self._sink)
        rng = random.Random(seed)
        spec = Sampling(temperature=0.0, max_new_tokens=max_new, ignore_eos=True)
        for i in range(running + waiting):
            prompt = [rng.randrange(100, 40000) for _ in range(PROMPT)]
            self.sched.submit(Request(f"r{i}", "bench", prompt, spec, frozenset({2}), key=i + 1))
        self.inflight: deque[tuple[PlannedStep, bytes]] = deque()
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.step_bytes = 0

    def _sink(self, batch: Batch) -> None:
        self.wire_bytes += len(batch_to_proto(batch).SerializeToString())

    def cycle(self) -> None:
        """Send one step (two in flight), then apply the oldest one's result."""
        sched, sec, clock = self.sched, self.seconds, time.thread_time
        st = sched.st
        assert st is not None
        while len(self.inflight) < 2:
            t0 = clock()
            plan = sched.builder.build()
            t1 = clock()
            data = model_pb2.StepRequest(step=encode_step(plan.ops)).SerializeToString()
            t2 = clock()
            sec["build"] += t1 - t0
            sec["encode"] += t2 - t1
            self.step_bytes += len(data)
            self.inflight.append((plan, _reply_bytes(data)))  # the model, untimed
        plan, reply = self.inflight.popleft()
        t0 = clock()
        res = decode_output(model_pb2.StepReply.FromString(reply).result)
        t1 = clock()
        apply_result(st, plan, res)
        st.stats.steps += 1
        t2 = clock()
        sched._flush()
        t3 = clock()
        sec["decode"] += t1 - t0
        sec["apply"] += t2 - t1
        sec["flush"] += t3 - t2

    def reset_counters(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.step_bytes = self.wire_bytes = 0


def measure(running: int, waiting: int, steps: int, warmup: int) -> dict[str, Any]:
    d = SchedulerDriver(running, waiting, steps + warmup)
    st = d.sched.st
    assert st is not None
    for _ in range(warmup):  # admission: every prompt prefilled, the batch decoding
        d.cycle()
    decoding = sum(r.phase.name == "DECODE" for r in st.running.values())
    d.reset_counters()
    for _ in range(steps):
        d.cycle()
    total = sum(d.seconds.values())
    return {
        "running": len(st.running),
        "decoding_at_start": decoding,
        "waiting": len(st.waiting),
        "steps": steps,
        "scheduler_cpu_ms_per_step": round(1e3 * total / steps, 4),
        **{f"{k}_ms_per_step": round(1e3 * v / steps, 4) for k, v in d.seconds.items()},
        "step_bytes_per_step": round(d.step_bytes / steps, 1),
        "front_door_bytes_per_step": round(d.wire_bytes / steps, 1),
        "retractions": st.stats.retractions,
    }


def run_scheduler(
    running: list[int], waiting: int, steps: int, warmup: int, repeats: int
) -> dict[str, Any]:
    """Per size: the best of `repeats` runs by total CPU per step (a shared box's noise only
    ever adds)."""
    out: dict[str, Any] = {}
    for n in running:
        for w in sorted({0, waiting}):
            runs = [measure(n, w, steps, warmup) for _ in range(repeats)]
            best = min(runs, key=lambda r: r["scheduler_cpu_ms_per_step"])
            best["all_runs_ms_per_step"] = [r["scheduler_cpu_ms_per_step"] for r in runs]
            out[f"running_{n}_waiting_{w}"] = best
    return out
