"""A local stack's shape: which services run (Topology), on which ports (sequential_ports,
free_port), with which arguments (topology_specs -> ServiceSpec). Pure description: nothing
here starts a process (services.launcher does).

Port order (Topology.names): the first of each kind in the classic order (front door,
scheduler, model, grammar: 50051-50054 under `radixmesh serve`), then the other replicas'
scheduler+model pairs, the other grammar services, the other front doors.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from services.drain import INTERNAL_EXTRA_S
from services.ports import PortUse

_HANDED_OUT: set[int] = set()  # ports this process gave out: never twice


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral range (outgoing connections' local ports), both ends included."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def quiet_ports(ephemeral: tuple[int, int]) -> range:
    """Where free_port draws: the larger stretch of 10000-65535 outside the ephemeral range.
    Machines differ: 32768-60999 (Linux's default) leaves 10000-32767, a container with
    1024-65535 leaves none, and one with 10000-20000 leaves 20001-65535."""
    low, high = ephemeral
    below = range(10_000, max(10_000, min(low, 65_536)))
    above = range(max(10_000, high + 1), 65_536)
    return below if len(below) >= len(above) else above


def free_port() -> int:
    """A free localhost port for a service to bind a moment later. Taken outside the kernel's
    ephemeral range: a port the kernel hands out (bind to 0) can be taken by any outgoing
    connection before the service binds it, which failed CI runs with "address in use"
    (twice: once with bind-to-0, once on a machine whose ephemeral range left no room below
    32768, so the fallback below ran)."""
    pool = quiet_ports(_ephemeral_range())
    for _ in range(200 if len(pool) > 1000 else 0):
        port = random.choice(pool)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServiceSpec:
    name: str
    module: str
    port: int
    args: list[str] = field(default_factory=list)
    public: bool = False  # the front door: its port is the public API, never mutual TLS
    health_port: int = 0  # probe this plaintext health-only port instead (--health-port)
    env: dict[str, str] = field(default_factory=dict)  # extra environment of this service
    # Other ports the service binds (HTTP, /metrics), checked with the gRPC one before start.
    extra_ports: tuple[PortUse, ...] = ()
    # The gRPC port is bound with SO_REUSEPORT by several front doors (Topology.shared_port).
    shared_port: bool = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def port_uses(self) -> list[PortUse]:
        """Every port this service binds, each with the `radixmesh serve` flag that moves it."""
        owner = (
            "the front doors' gRPC port"
            if self.shared_port
            else f"the {self.name} service's gRPC port"
        )
        uses = [PortUse(self.port, owner, "--port", self.shared_port)]
        if self.health_port:
            uses.append(PortUse(self.health_port, f"the {self.name} service's health port"))
        return [*uses, *self.extra_ports]

    @property
    def probe_address(self) -> str:
        return f"127.0.0.1:{self.health_port or self.port}"


@dataclass
class StackPorts:
    tokenizer: int = 50051
    scheduler: int = 50052
    model: int = 50053
    grammar: int = 50054
    http: int = 8000  # the front door's HTTP APIs (0: off)

    @staticmethod
    def free() -> StackPorts:
        return StackPorts(free_port(), free_port(), free_port(), free_port(), free_port())


def stack_specs(
    ports: StackPorts,
    model: str = "default",
    model_args: Sequence[str] = (),
    scheduler_args: Sequence[str] = (),
    tokenizer_args: Sequence[str] = (),
    grammar_args: Sequence[str] = (),
    shutdown_grace: float | None = None,
    metrics: StackPorts | None = None,
) -> list[ServiceSpec]:
    """One of each service on the given ports (see `topology_specs`)."""
    return topology_specs(
        Topology(),
        lambda name: int(getattr(ports, name)),
        model,
        http_port=ports.http,
        model_args=model_args,
        scheduler_args=scheduler_args,
        tokenizer_args=tokenizer_args,
        grammar_args=grammar_args,
        shutdown_grace=shutdown_grace,
        metrics_port=(lambda name: int(getattr(metrics, name))) if metrics else None,
    )


@dataclass(frozen=True)
class Topology:
    """How many of each service a local stack runs. A replica is one scheduler with its own
    model service (the scheduler owns that model's KV slots). Every front door connects to
    every replica; every scheduler to every grammar service. `replica_env`: extra environment
    per replica's model service, cycled (e.g. CUDA_VISIBLE_DEVICES per GPU).
    `shared_port`: several front doors listen on one public address (gRPC and HTTP, with
    SO_REUSEPORT: the kernel spreads connections over them), each with a plaintext
    health-only port of its own so the launcher can tell them apart; otherwise each front
    door has its own ports (tests and the router bench address them one by one)."""

    replicas: int = 1
    front_doors: int = 1
    grammars: int = 1
    replica_env: tuple[dict[str, str], ...] = ()
    shared_port: bool = False

    def __post_init__(self) -> None:
        if min(self.replicas, self.front_doors, self.grammars) < 1:
            raise ValueError(f"every count must be at least 1: {self}")

    @property
    def shares_port(self) -> bool:
        return self.shared_port and self.front_doors > 1

    def names(self) -> list[str]:
        """Port names in port order. With one of a kind its name is the kind
        ("scheduler"); with several, "scheduler-0", "scheduler-1", ... The first of each
        kind comes first in the classic order (front door, scheduler, model, grammar on
        consecutive ports: 50051-50054 whatever the counts), then the other replicas'
        scheduler+model pairs, the other grammar services and the other front doors.
        Front doors on a shared port: "tokenizer" (first) is the public address they all
        bind, and every front door's own name, at the end, its health-only port."""
        fd = _named("tokenizer", self.front_doors)
        pairs = zip(_named("scheduler", self.replicas), _named("model", self.replicas), strict=True)
        flat = [name for pair in pairs for name in pair]
        grammars = _named("grammar", self.grammars)
        first, rest = (["tokenizer"], fd) if self.shares_port else (fd[:1], fd[1:])
        return [*first, *flat[:2], grammars[0], *flat[2:], *grammars[1:], *rest]

    def is_service(self, name: str) -> bool:
        """False for the shared public address's name: a port, not a process."""
        return not (self.shares_port and name == "tokenizer")


def service_role(name: str) -> str:
    """The role a service authenticates as: its kind ("scheduler-1" -> "scheduler")."""
    return name.split("-", 1)[0]


def _named(kind: str, n: int) -> list[str]:
    return [kind] if n == 1 else [f"{kind}-{i}" for i in range(n)]


def sequential_ports(base: int, topo: Topology) -> Callable[[str], int]:
    """`radixmesh serve`'s ports: the front door on `base`, the rest on the next ones in
    `Topology.names` order."""
    table = {name: base + i for i, name in enumerate(topo.names())}
    return table.__getitem__


def topology_specs(
    topo: Topology,
    port_of: Callable[[str], int],
    model: str = "default",
    http_port: int = 0,
    model_args: Sequence[str] = (),
    scheduler_args: Sequence[str] = (),
    tokenizer_args: Sequence[str] = (),
    grammar_args: Sequence[str] = (),
    shutdown_grace: float | None = None,
    metrics_port: Callable[[str], int] | None = None,
) -> list[ServiceSpec]:
    """Specs for `topo`. `port_of(name)` gives each service's port (name per
    `Topology.names`, with the kind as the key when there is one of it: "scheduler");
    front door i serves HTTP on `http_port + i` (0: off), or all on `http_port` when they
    share the port (Topology.shared_port). `shutdown_grace`: the front doors'
    SIGTERM grace; internal services get a little more (services.drain), so requests
    that fit it never lose a dependency first. `metrics_port(name)`: each service's /metrics
    port (None: metrics off). `model_args` go to every model service as given (`--kv-tokens`
    is per model service here: the CLI splits a total)."""
    mk = _SpecMaker(port_of, metrics_port, _grace_args(shutdown_grace))
    grammars = _named("grammar", topo.grammars)
    grammar_list = ",".join(mk.addr(g) for g in grammars)
    specs = _replica_specs(topo, mk, model, model_args, scheduler_args, grammar_list)
    for g in grammars:
        gargs = ["--tokenizer", model, *grammar_args]
        specs.append(
            ServiceSpec(
                g, "grammar_service", port_of(g), mk.args(g, gargs), extra_ports=mk.ports(g)
            )
        )
    specs += _front_door_specs(topo, mk, model, http_port, tokenizer_args)
    return specs


def _grace_args(shutdown_grace: float | None) -> dict[str, list[str]]:
    """Each kind's SIGTERM grace flag: the front doors' as given, the internal services' a
    little longer (services.drain)."""
    extra: dict[str, list[str]] = {"model": [], "grammar": [], "scheduler": [], "tokenizer": []}
    if shutdown_grace is not None:
        inner = ["--shutdown-grace-s", str(shutdown_grace + INTERNAL_EXTRA_S)]
        for kind in ("model", "grammar", "scheduler"):
            extra[kind] += inner
        extra["tokenizer"] += ["--shutdown-grace-s", str(shutdown_grace)]
    return extra


@dataclass(frozen=True)
class _SpecMaker:
    """What every spec of one `topology_specs` call shares: the ports and each kind's extra
    arguments."""

    port_of: Callable[[str], int]
    metrics_port: Callable[[str], int] | None
    extra: dict[str, list[str]]  # by kind (service_role)

    def args(self, name: str, own: Sequence[str]) -> list[str]:
        out = [*own, *self.extra[service_role(name)]]
        if self.metrics_port is not None:
            out.append(f"--metrics-port={self.metrics_port(name)}")
        return out

    def ports(self, name: str, http: int = 0, shared: bool = False) -> tuple[PortUse, ...]:
        uses = []
        if http:
            owner = "the front doors' HTTP API" if shared else f"the {name} service's HTTP API"
            uses.append(PortUse(http, owner, "--http-port", shared))
        if self.metrics_port is not None and self.metrics_port(name):
            uses.append(
                PortUse(self.metrics_port(name), f"the {name} service's /metrics", "--metrics-port")
            )
        return tuple(uses)

    def addr(self, name: str) -> str:
        return f"127.0.0.1:{self.port_of(name)}"


def _replica_specs(
    topo: Topology,
    mk: _SpecMaker,
    model: str,
    model_args: Sequence[str],
    scheduler_args: Sequence[str],
    grammar_list: str,
) -> list[ServiceSpec]:
    """Each replica's model service, then its scheduler (pointed at that model and at every
    grammar service)."""
    specs: list[ServiceSpec] = []
    schedulers = _named("scheduler", topo.replicas)
    models = _named("model", topo.replicas)
    for i, (sched, mod) in enumerate(zip(schedulers, models, strict=True)):
        env = topo.replica_env[i % len(topo.replica_env)] if topo.replica_env else {}
        margs = ["--model", model, *model_args]
        specs.append(
            ServiceSpec(
                mod,
                "model_service",
                mk.port_of(mod),
                mk.args(mod, margs),
                env=env,
                extra_ports=mk.ports(mod),
            )
        )
        sargs = [f"--model-address={mk.addr(mod)}", f"--grammar-address={grammar_list}"]
        sargs = mk.args(sched, [*sargs, *scheduler_args])
        specs.append(
            ServiceSpec(
                sched, "scheduler_service", mk.port_of(sched), sargs, extra_ports=mk.ports(sched)
            )
        )
    return specs


def _front_door_specs(
    topo: Topology, mk: _SpecMaker, model: str, http_port: int, tokenizer_args: Sequence[str]
) -> list[ServiceSpec]:
    """Every front door, each connected to every scheduler; on a shared port they all bind
    the "tokenizer" address and each probes its own health-only port."""
    scheduler_list = ",".join(mk.addr(s) for s in _named("scheduler", topo.replicas))
    shared = topo.shares_port
    specs: list[ServiceSpec] = []
    for i, fd in enumerate(_named("tokenizer", topo.front_doors)):
        http = (http_port if shared else http_port + i) if http_port else 0
        targs = [
            f"--scheduler-address={scheduler_list}",
            f"--http-port={http}",
            "--model",
            model,
            *(["--reuse-port"] if shared else []),
            *tokenizer_args,
        ]
        specs.append(
            ServiceSpec(
                fd,
                "tokenizer_service",
                mk.port_of("tokenizer") if shared else mk.port_of(fd),
                mk.args(fd, targs),
                public=True,
                health_port=mk.port_of(fd) if shared else 0,
                extra_ports=mk.ports(fd, http, shared),
                shared_port=shared,
            )
        )
    return specs
