"""Local launcher: every service is its own OS process on its own localhost port. Waits for
readiness, restarts a service that dies (exponential backoff), stops all on exit.

Used by `radixmesh serve` and by the integration tests (which kill services through it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = structlog.get_logger(__name__)

PARENT_ENV = "RADIXMESH_PARENT_PID"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServiceSpec:
    name: str
    module: str
    port: int
    args: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class StackPorts:
    tokenizer: int = 50051
    scheduler: int = 50052
    model: int = 50053
    grammar: int = 50054

    @staticmethod
    def free() -> StackPorts:
        return StackPorts(free_port(), free_port(), free_port(), free_port())


def stack_specs(
    ports: StackPorts,
    model: str = "default",
    model_args: Sequence[str] = (),
    scheduler_args: Sequence[str] = (),
    tokenizer_args: Sequence[str] = (),
    grammar_args: Sequence[str] = (),
    metrics: StackPorts | None = None,
) -> list[ServiceSpec]:
    """`metrics`: each service's /metrics port (None: metrics off)."""
    p = ports
    if metrics is not None:
        m = metrics
        model_args = [*model_args, f"--metrics-port={m.model}"]
        grammar_args = [*grammar_args, f"--metrics-port={m.grammar}"]
        scheduler_args = [*scheduler_args, f"--metrics-port={m.scheduler}"]
        tokenizer_args = [*tokenizer_args, f"--metrics-port={m.tokenizer}"]
    return [
        ServiceSpec("model", "model_service", p.model, ["--model", model, *model_args]),
        ServiceSpec("grammar", "grammar_service", p.grammar, ["--tokenizer", model, *grammar_args]),
        ServiceSpec(
            "scheduler",
            "scheduler_service",
            p.scheduler,
            [
                f"--model-address=127.0.0.1:{p.model}",
                f"--grammar-address=127.0.0.1:{p.grammar}",
                *scheduler_args,
            ],
        ),
        ServiceSpec(
            "tokenizer",
            "tokenizer_service",
            p.tokenizer,
            [f"--scheduler-address=127.0.0.1:{p.scheduler}", "--model", model, *tokenizer_args],
        ),
    ]


async def check_ready(address: str, service: str = "readiness", timeout: float = 1.0) -> bool:
    try:
        async with grpc.aio.insecure_channel(address) as chan:
            stub = health_pb2_grpc.HealthStub(chan)
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
            return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)
    except grpc.aio.AioRpcError:
        return False


class Launcher:
    """Owns the service processes. Invariant: each spec has at most one live process."""

    def __init__(
        self,
        specs: list[ServiceSpec],
        log_dir: Path | None = None,
        env: dict[str, str] | None = None,
        max_backoff: float = 5.0,
    ) -> None:
        self.specs = {s.name: s for s in specs}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: dict[str, int] = {s.name: 0 for s in specs}
        self.log_dir = log_dir
        # Services watch this pid and stop when the launcher is gone (radixmesh_server.server).
        self.env = {**os.environ, **(env or {}), PARENT_ENV: str(os.getpid())}
        self.max_backoff = max_backoff
        self._stopping = False
        self._logs: list[Any] = []

    def start(self, name: str) -> None:
        spec = self.specs[name]
        cmd = [sys.executable, "-m", spec.module, "--port", str(spec.port), *spec.args]
        out: Any = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            f = (self.log_dir / f"{name}.log").open("ab")
            self._logs.append(f)
            out = f
        self.procs[name] = subprocess.Popen(
            cmd, env=self.env, stdout=out, stderr=out, start_new_session=True
        )
        log.info("service_started", service=name, pid=self.procs[name].pid, port=spec.port)

    def start_all(self) -> None:
        for name in self.specs:
            self.start(name)

    async def wait_ready(
        self, timeout: float = 300.0, names: Sequence[str] | None = None, fail_on_exit: bool = True
    ) -> None:
        """Until every named service reports readiness. `fail_on_exit=False` while `supervise`
        is running: a dead process is then about to be restarted, not a start-up failure."""
        deadline = time.monotonic() + timeout
        pending = list(names or self.specs)
        while pending:
            for name in list(pending):
                proc = self.procs.get(name)
                if fail_on_exit and proc is not None and proc.poll() is not None:
                    raise RuntimeError(
                        f"service {name} exited with code {proc.returncode} "
                        f"during start-up{self._log_hint(name)}"
                    )
                if await check_ready(self.specs[name].address):
                    pending.remove(name)
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"services not ready after {timeout:.0f}s: {pending}")
            if pending:
                await asyncio.sleep(0.2)

    def _log_hint(self, name: str) -> str:
        return f" (see {self.log_dir / (name + '.log')})" if self.log_dir else ""

    async def supervise(self) -> None:
        """Restart services that die, with exponential backoff per service."""
        while not self._stopping:
            for name, proc in list(self.procs.items()):
                if proc.poll() is not None and not self._stopping:
                    n = self.restarts[name] = self.restarts[name] + 1
                    delay = min(0.25 * 2 ** (n - 1), self.max_backoff)
                    log.warning(
                        "service_died",
                        service=name,
                        code=proc.returncode,
                        restart_in_s=delay,
                        restarts=n,
                    )
                    await asyncio.sleep(delay)
                    if not self._stopping:
                        self.start(name)
            await asyncio.sleep(0.1)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        proc = self.procs[name]
        proc.send_signal(sig)
        return proc.pid

    def stop_all(self, grace: float = 5.0) -> None:
        self._stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(deadline - time.monotonic(), 0.1))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for f in self._logs:
            f.close()
