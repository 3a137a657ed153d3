"""Shared fixtures. Integration stacks are started once per test session and configuration:
every service is a real OS process on free localhost ports, spoken to over gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from services.launcher import (
    Launcher,
    ServiceSpec,
    StackPorts,
    Topology,
    check_ready,
    free_port,
    stack_specs,
    topology_specs,
)
from services.model_store import resolve_model
from services.security import internal_channel


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return resolve_model("default")


@dataclass
class Stack:
    launcher: Launcher
    ports: StackPorts
    log_dir: Path
    metrics_ports: StackPorts | None = None  # each service's /metrics port
    topology: Topology = Topology()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.ports.tokenizer}"

    def names(self, kind: str) -> list[str]:
        """The services of one kind ("scheduler" -> ["scheduler-0", "scheduler-1"])."""
        names = filter(self.topology.is_service, self.topology.names())
        return [n for n in names if n.split("-", 1)[0] == kind]

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.http}"

    def address(self, name: str) -> str:
        return self.launcher.specs[name].address

    def ready(self, name: str, service: str = "readiness") -> bool:
        """One health check of a service, with the launcher's certificate (internal mTLS)."""
        tls = self.launcher.probe_tls(name)
        addr = self.launcher.specs[name].probe_address
        return asyncio.run(check_ready(addr, service, tls=tls))

    def channel_as(self, name: str, role: str) -> grpc.aio.Channel:
        """An asyncio channel to internal service `name`, presenting the certificate of `role`
        (e.g. "tokenizer" to reach the scheduler, "scheduler" to reach model or grammar)."""
        files = self.launcher.pki.get(role)  # None: a stack without internal TLS
        return internal_channel(self.address(name), files.internal() if files else None)

    def wait_ready(self, names: list[str] | None = None, timeout: float = 120.0) -> None:
        asyncio.run(self.launcher.wait_ready(timeout=timeout, names=names, fail_on_exit=False))


def _first_ports(table: dict[str, int], http: int) -> StackPorts:
    """`Stack.ports` of a topology: the port of the first service of each kind."""
    first: dict[str, int] = {}
    for name, port in table.items():
        first.setdefault(name.split("-", 1)[0], port)
    return StackPorts(
        first["tokenizer"], first["scheduler"], first["model"], first["grammar"], http
    )


@contextlib.contextmanager
def _supervised(launcher: Launcher) -> Iterator[None]:
    """Start every service, wait until all are ready, restart any that dies while the
    caller runs (the launcher's supervise loop on a thread), stop them all at the end."""
    launcher.start_all()
    loop = asyncio.new_event_loop()
    supervisor = threading.Thread(
        target=loop.run_until_complete, args=(launcher.supervise(),), daemon=True
    )
    try:
        asyncio.run(launcher.wait_ready(timeout=300))
        supervisor.start()
        yield
    finally:
        launcher.stop_all()
        supervisor.join(timeout=5)


def start_stack(
    tmp: Path,
    model_args: list[str] | None = None,
    scheduler_args: list[str] | None = None,
    tokenizer_args: list[str] | None = None,
    internal_tls: bool = True,
    tokenizer_health_port: int = 0,
    topology: Topology | None = None,
    front_door_args: dict[str, list[str]] | None = None,
    before_start: Callable[[dict[str, ServiceSpec]], None] | None = None,
) -> Generator[Stack, None, None]:
    """A whole stack as `radixmesh serve` runs it: internal links over mutual TLS.
    `tokenizer_health_port`: probe the front door there (needed when its port speaks TLS).
    `topology`: several replicas / front doors / grammar services (launcher.topology_specs;
    HTTP off, `ports` names the first of each kind); `front_door_args[name]` are appended to
    that front door's arguments (the last of a repeated flag wins). `before_start(specs by
    name)` runs before any process starts (e.g. to write a replica file)."""
    metrics: StackPorts | None = StackPorts.free()
    if topology is None:
        topology = Topology()
        ports = StackPorts.free()
        specs = stack_specs(
            ports,
            "default",
            model_args=model_args or [],
            scheduler_args=scheduler_args or [],
            tokenizer_args=tokenizer_args or [],
            metrics=metrics,
        )
    else:
        metrics = None
        table = {name: free_port() for name in topology.names()}
        ports = _first_ports(table, http=0)
        specs = topology_specs(
            topology,
            table.__getitem__,
            "default",
            model_args=model_args or [],
            scheduler_args=scheduler_args or [],
            tokenizer_args=tokenizer_args or [],
        )
    for spec in specs:
        spec.args += (front_door_args or {}).get(spec.name, [])
    for spec in specs:
        if spec.name == "tokenizer":
            spec.health_port = tokenizer_health_port
    if before_start is not None:
        before_start({spec.name: spec for spec in specs})
    launcher = Launcher(
        specs,
        log_dir=tmp,
        max_backoff=0.5,
        internal_tls=internal_tls,
    )
    with _supervised(launcher):
        yield Stack(launcher, ports, tmp, metrics, topology)


def start_topology_stack(
    tmp: Path,
    topo: Topology,
    model_args: list[str] | None = None,
    scheduler_args: list[str] | None = None,
    grammar_args: list[str] | None = None,
) -> Generator[Stack, None, None]:
    """A stack of several schedulers / grammar services / front doors (`Topology`), as
    `radixmesh serve --replicas/--grammar-replicas/--front-doors` runs it, on free ports with
    internal mutual TLS and /metrics on. Services are named as in `Topology.names`
    ("grammar-0", "grammar-1", ...); `Stack.ports` names the first of each kind."""
    table = {name: free_port() for name in topo.names()}
    metrics = {name: free_port() for name in topo.names()}
    http = free_port()
    specs = topology_specs(
        topo,
        table.__getitem__,
        "default",
        http_port=http,
        model_args=model_args or [],
        scheduler_args=scheduler_args or [],
        grammar_args=grammar_args or [],
        metrics_port=metrics.__getitem__,
    )

    ports = _first_ports(table, http)
    launcher = Launcher(specs, log_dir=tmp, max_backoff=0.5, internal_tls=True)
    with _supervised(launcher):
        yield Stack(launcher, ports, tmp)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """The default CPU stack, with the KV invariant checked after every step."""
    yield from start_stack(
        tmp_path_factory.mktemp("stack"), ["--kv-tokens", "16384"], ["--debug-invariants"]
    )


@pytest.fixture(scope="session")
def nan_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """Freed KV slots are poisoned with NaN: any read after free corrupts outputs."""
    yield from start_stack(
        tmp_path_factory.mktemp("nanstack"),
        ["--kv-tokens", "16384", "--nan-fill"],
        ["--debug-invariants"],
    )


@dataclass
class ReplicaStack:
    """Two replicas and two front doors. "tokenizer-0" takes the replica list as flags;
    "tokenizer-1" reads it from `replica_file` (re-read every 0.2 s), which starts with both
    replicas: a test may rewrite it (`write_replicas`) and must leave both listed."""

    stack: Stack
    replica_file: Path

    def front_door(self, i: int) -> str:
        return self.stack.address(f"tokenizer-{i}")

    def write_replicas(self, names: list[str]) -> None:
        text = "".join(f"{self.stack.address(n)}\n" for n in names)
        tmp = self.replica_file.with_suffix(".new")
        tmp.write_text(text)
        tmp.replace(self.replica_file)  # atomic: the reader never sees half a file


@pytest.fixture(scope="session")
def replica_stack(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path
) -> Iterator[ReplicaStack]:
    """The scale-out stack (issue 16), shared by every test that needs several replicas."""
    tmp = tmp_path_factory.mktemp("replicas")
    replica_file = tmp / "replicas.txt"

    def write_file(specs: dict[str, ServiceSpec]) -> None:
        replica_file.write_text(f"{specs['scheduler-0'].address}\n{specs['scheduler-1'].address}\n")

    file_args = ["--scheduler-address", f"file:{replica_file}", "--resolve-interval-s", "0.2"]
    for st in start_stack(
        tmp,
        ["--kv-tokens", "8192"],
        topology=Topology(replicas=2, front_doors=2),
        front_door_args={"tokenizer-1": file_args},
        before_start=write_file,
    ):
        yield ReplicaStack(st, replica_file)


@dataclass
class LoneModel:
    address: str
    pid: int


@pytest.fixture(scope="session")
def lone_model(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[LoneModel]:
    """A model service with no scheduler, for tests that speak the step protocol themselves
    (a step session replaces any other, so they cannot share a stack's model). Short mask
    wait and few handles, so their bounds are quick to reach."""
    spec = ServiceSpec(
        "model",
        "model_service",
        free_port(),
        ["--kv-tokens", "4096", "--mask-wait-s", "1", "--max-handles", "64"],
    )
    launcher = Launcher([spec], log_dir=tmp_path_factory.mktemp("lone_model"))
    launcher.start_all()
    try:
        asyncio.run(launcher.wait_ready(timeout=300))
        yield LoneModel(spec.address, launcher.procs["model"].pid)
    finally:
        launcher.stop_all()
