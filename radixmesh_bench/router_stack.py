"""The local topologies `radixmesh bench router` compares, started the way `radixmesh serve
--replicas N --front-doors M` starts them (services.launcher: Topology, topology_specs,
internal mutual TLS), on free ports, with every service's /metrics on a free port.

Invariant: every configuration of one workload gets the same TOTAL KV pool, split evenly over
its replicas (`--kv-tokens` per model service = total // replicas), so a difference in hit rate
is the routing's, not more memory's.

Only two front-door flags come from the multi-replica front door: a comma list in
`--scheduler-address` (which topology_specs writes) and `--router NAME`, passed only when there
is more than one replica (a single replica has nothing to route).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from radixmesh_bench.prom_text import Samples, scrape
from radixmesh_bench.stack import launcher_for
from radixmesh_bench.stack import running as started
from services.launcher import (
    ServiceSpec,
    Topology,
    free_port,
    service_role,
    topology_specs,
)

ROUTERS = ("cache_aware", "round_robin", "least_load")
SINGLE = "single"  # the router name of the 1-replica baseline


@dataclass(frozen=True)
class RouterConfig:
    replicas: int
    router: str  # one of ROUTERS, or SINGLE with one replica
    front_doors: int = 1

    @property
    def label(self) -> str:
        base = "1 replica" if self.replicas == 1 else f"{self.replicas} replicas {self.router}"
        return base if self.front_doors == 1 else f"{base}, {self.front_doors} front doors"


def configurations(
    replicas: Sequence[int], routers: Sequence[str], front_doors: int, front_door_replicas: int
) -> list[RouterConfig]:
    """1 replica (if listed) once; each replica count > 1 with each router; then, when
    `front_doors` > 1, cache_aware on `front_door_replicas` replicas behind that many front
    doors."""
    for r in routers:
        if r not in ROUTERS:
            raise ValueError(f"unknown router {r!r}; choose from {', '.join(ROUTERS)}")
    out: list[RouterConfig] = []
    for n in replicas:
        if n < 1:
            raise ValueError(f"replica counts must be at least 1, got {n}")
        if n == 1:
            out.append(RouterConfig(1, SINGLE))
        else:
            out += [RouterConfig(n, r) for r in routers]
    if front_doors > 1:
        if front_door_replicas < 2:
            raise ValueError("the several-front-door configuration needs at least 2 replicas")
        out.append(RouterConfig(front_door_replicas, "cache_aware", front_doors))
    return list(dict.fromkeys(out))  # drop repeats, keep order


def per_replica_kv(total: int, replicas: int) -> int:
    return total // replicas


@dataclass
class RunningTopology:
    endpoints: list[str]  # the front doors' public gRPC addresses
    scheduler_metrics: dict[str, str]  # scheduler name -> its /metrics URL
    front_door_metrics: dict[str, str]  # front door name -> its /metrics URL

    def scrape_schedulers(self) -> dict[str, Samples]:
        return {name: scrape(url) for name, url in self.scheduler_metrics.items()}

    def scrape_front_doors(self) -> dict[str, Samples]:
        return {name: scrape(url) for name, url in self.front_door_metrics.items()}


def plan(
    cfg: RouterConfig,
    model: str,
    model_args: Sequence[str],
    kv_total: int,
    scheduler_args: Sequence[str],
    port: Callable[[str], int] | None = None,
    front_door_args: Sequence[str] = (),
) -> tuple[list[ServiceSpec], RunningTopology]:
    """`cfg`'s service specs and where to reach them. `port(name)` gives each service's gRPC
    port and `port(name + ":metrics")` its /metrics port (default: free ports)."""
    topo = Topology(replicas=cfg.replicas, front_doors=cfg.front_doors)
    names = topo.names()
    take = port or (lambda _: free_port())
    ports = {n: take(n) for n in names}
    metrics = {n: take(f"{n}:metrics") for n in names}
    tok_args = [*(["--router", cfg.router] if cfg.replicas > 1 else []), *front_door_args]
    specs = topology_specs(
        topo,
        ports.__getitem__,
        model,
        model_args=[*model_args, "--kv-tokens", str(per_replica_kv(kv_total, cfg.replicas))],
        scheduler_args=scheduler_args,
        tokenizer_args=tok_args,
        metrics_port=metrics.__getitem__,
    )
    kinds = {n: kind(n) for n in names}
    running = RunningTopology(
        endpoints=[f"127.0.0.1:{ports[n]}" for n in names if kinds[n] == "tokenizer"],
        scheduler_metrics={
            n: f"http://127.0.0.1:{metrics[n]}/metrics" for n in names if kinds[n] == "scheduler"
        },
        front_door_metrics={
            n: f"http://127.0.0.1:{metrics[n]}/metrics" for n in names if kinds[n] == "tokenizer"
        },
    )
    return specs, running


kind = service_role  # "scheduler-1" -> "scheduler"


@contextlib.contextmanager
def start_topology(
    cfg: RouterConfig,
    model: str,
    model_args: Sequence[str],
    kv_total: int,
    scheduler_args: Sequence[str],
    log_dir: Path,
    timeout_s: float = 600.0,
    front_door_args: Sequence[str] = (),
) -> Iterator[RunningTopology]:
    """Start `cfg`'s services (internal links over mutual TLS, as `radixmesh serve`), wait
    until every one is ready, yield, stop them all."""
    specs, topology = plan(
        cfg, model, model_args, kv_total, scheduler_args, front_door_args=front_door_args
    )
    with started(launcher_for(specs, log_dir, internal_tls=True), timeout=timeout_s):
        yield topology
