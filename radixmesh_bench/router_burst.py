"""A burst through M front doors onto N replicas, replayed on a virtual clock: the real routing
code (tokenizer_service.routing: ReplicaSet, SchedulerLink, ReplicaView, Router) fed by
simulated schedulers. Deterministic, CPU only, seconds. JSON on stdout.

    python -m radixmesh_bench.router_burst --replicas 2 --front-doors 2 [--router cache_aware]

What is simulated (the rest is the real code):
- The workload: the committed ShareGPT sample (radixmesh_bench/data/sharegpt_2000.json.gz:
  prompt token ids, output lengths as `max_new_tokens`) or a GSP burst (`gsp`), every request
  sent at once (`send_ms` apart), each to a front door picked as SO_REUSEPORT would (a seeded
  random pick per connection, or in turn with `--spread turn`).
- A front door is one event loop working through what reached it in arrival order: client
  requests (`route_ms` each: HTTP, tokenizing, routing) and its replicas' messages (`msg_ms`),
  so a load report sent during a burst waits behind the requests that arrived before it.
- Each replica is a scheduler and its model: requests arrive `net_ms` after routing; each is
  published as a provisional hold (CacheEvents to every front door on the next loop turn, as
  scheduler_service/sessions/replica_feed.py); steps prefill up to `chunk_tokens` prompt tokens
  (FCFS, at most `max_running` running) and decode one token per running request, taking
  `base_ms + prefill_ms * prefilled + row_ms * rows`; after each step its LoadReport (as
  `load_of`: waiting/running requests, tokens still to prefill + output budgets left) goes to
  every front door if `load_interval_ms` passed and it changed.
Not modelled: prefix-cache hits shortening a prefill, a prefix shared by waiting requests
counted once in the load, eviction (the runs fit the H200's KV). The run ends once every
request is routed (what follows no longer moves a decision). Reported
per replica: requests, prompt and output tokens routed there, and the routing reasons.
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import json
import logging
import random
import sys
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from radixmesh_wire.cache_blocks import BLOCK_TOKENS, block_hashes
from radixmesh_wire.pb import scheduler_pb2
from services.discovery import parse_address_spec
from tokenizer_service.routing.replica_set import ReplicaSet, Ticket
from tokenizer_service.routing.router import Policy, Router

SAMPLE = Path(__file__).resolve().parent / "data" / "sharegpt_2000.json.gz"
KV_CAPACITY = 823_446  # tokens per replica: one H200 with the random 8B (the GPU runs' figure)


@dataclass(frozen=True)
class Timing:
    """The virtual clock's constants, in milliseconds (defaults: the GPU runs' order)."""

    send_ms: float = 0.1  # the client sends request i at i * send_ms
    route_ms: float = 0.5  # a front door's work per request (HTTP, tokenizing, routing)
    msg_ms: float = 0.02  # ... per message from a replica
    net_ms: float = 0.3  # the wire, either way
    base_ms: float = 10.0
    prefill_ms: float = 0.004
    row_ms: float = 0.02
    load_interval_ms: float = 5.0
    chunk_tokens: int = 2048
    max_running: int = 512


@dataclass(frozen=True)
class Request:
    rid: str
    ids: list[int]
    out: int


@dataclass
class Running:
    req: Request
    hashes: list[int]
    ticket: Ticket  # the front door's handle: told when the request ends
    door: int  # which front door routed it
    filled: int = 0  # prompt tokens prefilled
    made: int = 0  # output tokens generated


@dataclass
class Replica:
    """One scheduler + model: a FCFS queue, chunked prefill, one token per step per row."""

    address: str
    t: Timing
    waiting: list[Running] = field(default_factory=list)
    running: list[Running] = field(default_factory=list)
    busy: bool = False
    holds: Counter[int] = field(default_factory=Counter)
    added: set[int] = field(default_factory=set)  # published since the last drain
    removed: set[int] = field(default_factory=set)
    next_load: float = float("-inf")
    last_load: tuple[int, int, int, int] | None = None

    def arrive(self, run: Running) -> None:
        self.waiting.append(run)
        for h in run.hashes:
            if self.holds[h] == 0:
                self.added.add(h)
                self.removed.discard(h)
            self.holds[h] += 1

    def step(self) -> tuple[float, list[Running]]:
        """Plan and apply one step: its duration in ms and the requests it finished."""
        budget, rows = self.t.chunk_tokens, 0
        for r in self.running:  # a chunked prefill under way first
            if r.filled < len(r.req.ids) and budget > 0:
                n = min(budget, len(r.req.ids) - r.filled)
                r.filled += n
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.t.max_running:
            r = self.waiting.pop(0)
            n = min(budget, len(r.req.ids))
            r.filled = n
            budget -= n
            self.running.append(r)
        done: list[Running] = []
        for r in self.running:
            if r.filled == len(r.req.ids):
                r.made += 1
                rows += 1
                if r.made >= r.req.out:
                    done.append(r)
        for r in done:  # the tree keeps the prompt: its blocks stay published
            self.running.remove(r)
        prefilled = self.t.chunk_tokens - budget
        return self.t.base_ms + self.t.prefill_ms * prefilled + self.t.row_ms * rows, done

    def load(self) -> scheduler_pb2.LoadReport:
        waiting_tokens = sum(len(r.req.ids) + r.req.out for r in self.waiting)
        running_tokens = sum(len(r.req.ids) - r.filled + r.req.out - r.made for r in self.running)
        return scheduler_pb2.LoadReport(
            waiting_requests=len(self.waiting),
            running_requests=len(self.running),
            waiting_tokens=waiting_tokens,
            running_tokens=running_tokens,
            kv_capacity=KV_CAPACITY,
            kv_free=KV_CAPACITY,
        )

    def feed(self, now: float, loaded: bool) -> scheduler_pb2.SchedulerMessage | None:
        """The flush's message to every session: cache changes, and the load when due."""
        msg = scheduler_pb2.SchedulerMessage()
        if self.added or self.removed:
            msg.cache.added.extend(sorted(self.added))
            msg.cache.removed.extend(sorted(self.removed))
            self.added, self.removed = set(), set()
        if loaded and now >= self.next_load:
            self.next_load = now + self.t.load_interval_ms
            report = self.load()
            key = (
                report.waiting_requests,
                report.running_requests,
                report.waiting_tokens,
                report.running_tokens,
            )
            if key != self.last_load:
                self.last_load = key
                msg.load.CopyFrom(report)
        return msg if msg.ByteSize() else None


def gsp(groups: int = 64, questions: int = 16, prefix: int = 2048, seed: int = 1) -> list[Request]:
    """SGLang's generated-shared-prefix shape: `groups` system prompts of `prefix` tokens, each
    with `questions` distinct 128-token questions, 256 out; arrivals shuffled across groups."""
    rng = random.Random(seed)
    heads = [[rng.randrange(1000, 120_000) for _ in range(prefix)] for _ in range(groups)]
    out = [
        Request(f"g{g}q{q}", [*heads[g], *(rng.randrange(1000, 120_000) for _ in range(128))], 256)
        for g in range(groups)
        for q in range(questions)
    ]
    rng.shuffle(out)
    return out


def read_sample(path: Path = SAMPLE, limit: int = 0) -> list[Request]:
    with gzip.open(path, "rt") as f:
        d = json.load(f)
    pairs = list(zip(d["prompt_ids"], d["output_lens"], strict=True))
    if limit:
        pairs = pairs[:limit]
    return [Request(f"r{i}", list(ids), int(out)) for i, (ids, out) in enumerate(pairs)]


class Door:
    """A front door: its routing state (the real ReplicaSet, links connected and serving, no
    I/O) and one event loop working through what reached it in order: client requests
    (`route_ms` each) and the replicas' messages (`msg_ms` each). A message waits behind the
    requests that arrived before it, as in asyncio's ready queue: that is the lag of its load
    reports during a burst."""

    def __init__(self, addresses: list[str], router: Router) -> None:
        self.rs = ReplicaSet(parse_address_spec(",".join(addresses)), router, start_links=False)
        for a in addresses:
            link = self.rs.add(a)
            link.view.on_hello(f"instance-{a}", BLOCK_TOKENS, KV_CAPACITY)
            link.down_since = None
            link.connected.set()
        self.inbox: deque[tuple[str, Any]] = deque()
        self.busy = False


class Burst:
    """The event loop of one run: (time, order, kind, payload) in a heap; `on_<kind>` each."""

    def __init__(self, addresses: list[str], doors: list[Door], t: Timing) -> None:
        self.t = t
        self.doors = doors
        self.reps = {a: Replica(a, t) for a in addresses}
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.now = 0.0
        self.routed_to: dict[str, str] = {}

    def at(self, when: float, kind: str, what: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, kind, what))

    def to_door(self, when: float, f: int, item: tuple[str, Any]) -> None:
        self.at(when, "door_in", (f, item))

    def run(self, until_routed: int) -> None:
        while self.events and len(self.routed_to) < until_routed:
            self.now, _, kind, what = heapq.heappop(self.events)
            getattr(self, f"on_{kind}")(what)

    def on_door_in(self, what: tuple[int, tuple[str, Any]]) -> None:
        f, item = what
        self.doors[f].inbox.append(item)
        if not self.doors[f].busy:
            self.doors[f].busy = True
            self.at(self.now, "door_next", f)

    def on_door_next(self, f: int) -> None:
        """The front door's loop takes its next item."""
        door, t = self.doors[f], self.t
        if not door.inbox:
            door.busy = False
            return
        kind, item = door.inbox.popleft()
        if kind == "route":
            ticket = _submit(door.rs, item)
            self.routed_to[item.rid] = ticket.link.address
            run = Running(item, block_hashes(item.ids), ticket, f)
            self.at(self.now + t.route_ms + t.net_ms, "arrive", (ticket.link.address, run))
            self.at(self.now + t.route_ms, "door_next", f)
            return
        if kind == "feed":
            door.rs.links[item[0]]._observe(item[1])
        else:  # "done": the request's stream ended
            door.rs.done(item)
        self.at(self.now + t.msg_ms, "door_next", f)

    def on_arrive(self, what: tuple[str, Running]) -> None:
        a, run = what
        rep = self.reps[a]
        rep.arrive(run)
        self.publish(rep, False)
        if not rep.busy:
            rep.busy = True
            self.at(self.now, "step", a)

    def on_step(self, a: str) -> None:
        """A step boundary: the last step's outcome goes out, the next step starts."""
        rep = self.reps[a]
        self.publish(rep, True)
        if not (rep.waiting or rep.running):
            rep.busy = False
            return
        took, done = rep.step()
        for run in done:
            self.to_door(self.now + took + self.t.net_ms, run.door, ("done", run.ticket))
        self.at(self.now + took, "step", a)

    def publish(self, rep: Replica, loaded: bool) -> None:
        """The replica's flush: its feed, if any, to every front door's session."""
        msg = rep.feed(self.now, loaded)
        if msg is not None:
            for f in range(len(self.doors)):
                self.to_door(self.now + self.t.net_ms, f, ("feed", (rep.address, msg)))


def simulate(
    requests: list[Request],
    replicas: int,
    front_doors: int,
    policy: Policy = Policy.CACHE_AWARE,
    timing: Timing | None = None,
    spread: str = "random",
    seed: int = 1,
) -> dict[str, Any]:
    """Route `requests` (all sent at once, `send_ms` apart) and report where they went."""
    t = timing or Timing()
    addresses = [f"10.0.0.{i + 1}:50052" for i in range(replicas)]
    doors = [Door(addresses, Router(policy)) for _ in range(front_doors)]
    sim = Burst(addresses, doors, t)
    rng = random.Random(seed)
    for i, r in enumerate(requests):
        f = i % front_doors if spread == "turn" else rng.randrange(front_doors)
        sim.to_door(i * t.send_ms, f, ("route", r))
    sim.run(len(requests))
    return _report(requests, sim.routed_to, [d.rs for d in doors], addresses, sim.now)


def _submit(rs: ReplicaSet, r: Request) -> Ticket:
    msg = scheduler_pb2.SubmitRequest(rid=r.rid, input_ids=r.ids)
    msg.sampling.max_new_tokens = r.out
    ticket = rs.submit(msg)
    ticket.link.out.get_nowait()  # what the link would send: the simulation delivers it
    return ticket


def _report(
    requests: list[Request],
    routed_to: dict[str, str],
    doors: list[ReplicaSet],
    addresses: list[str],
    now: float,
) -> dict[str, Any]:
    per: dict[str, dict[str, Any]] = {
        a: {"requests": 0, "prompt_tokens": 0, "output_tokens": 0, "reasons": Counter()}
        for a in addresses
    }
    for r in requests:
        p = per[routed_to[r.rid]]
        p["requests"] += 1
        p["prompt_tokens"] += len(r.ids)
        p["output_tokens"] += r.out
    for d in doors:
        for a, c in d.counts.items():
            per[a]["reasons"].update(c.by_reason)
    work = [p["prompt_tokens"] + p["output_tokens"] for p in per.values()]
    # Prompts sharing a first block (a GSP group, a repeated ShareGPT opening): each replica
    # past the first that got some of them computes that prefix again.
    where: dict[int, set[str]] = {}
    for r in requests:
        if len(r.ids) >= BLOCK_TOKENS:
            where.setdefault(block_hashes(r.ids[:BLOCK_TOKENS])[0], set()).add(routed_to[r.rid])
    return {
        "extra_prefix_copies": sum(len(v) - 1 for v in where.values()),
        "replicas": [
            {"address": a, **p, "reasons": dict(sorted(p["reasons"].items()))}
            for a, p in per.items()
        ],
        "work_max_over_mean": round(max(work) * len(work) / sum(work), 3),
        "routed_by_ms": round(now, 1),
    }


def quiet() -> None:
    """The routing code's per-request debug events would drown the figures."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--front-doors", type=int, default=1)
    ap.add_argument("--router", default="cache_aware", choices=[p.value for p in Policy])
    ap.add_argument("--spread", default="random", choices=["random", "turn"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workload", default="sharegpt", choices=["sharegpt", "gsp"])
    ap.add_argument("--limit", type=int, default=0, help="the first N requests only")
    for f, v in asdict(Timing()).items():
        ap.add_argument(f"--{f.replace('_', '-')}", type=type(v), default=v)
    a = ap.parse_args(argv)
    quiet()
    timing = Timing(**{f: getattr(a, f) for f in asdict(Timing())})
    reqs = read_sample(limit=a.limit) if a.workload == "sharegpt" else gsp(seed=a.seed)
    out = simulate(reqs, a.replicas, a.front_doors, Policy(a.router), timing, a.spread, a.seed)
    out["config"] = {k: v for k, v in vars(a).items() if k not in asdict(timing)}
    out["config"].update(asdict(timing))
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
