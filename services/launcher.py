"""Local launcher: every service is its own OS process on its own localhost port. Waits for
readiness, restarts a service that dies (exponential backoff) or stops answering its liveness
check (a frozen process, or one whose watchdog reports a stuck loop: SIGKILL, then restart),
stops all on exit (SIGTERM: each service drains).

Start-up failures are reported, not hidden: ports are checked before starting, each service's
output always goes to a log file (a temporary folder without `log_dir`) whose last lines reach
stderr when the service dies, and a service that keeps dying before it ever gets ready is not
restarted forever: after `max_startup_failures` such deaths in a row `supervise` raises
`StartupFailure` naming the reason.

Used by `radixmesh serve` and by the integration tests (which kill services through it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.log_tail import death_report, log_size, make_private_dir
from services.pki import CertFiles, make_local_pki
from services.ports import PortUse, first_problem, port_in_use, port_message
from services.security import internal_channel
from services.topology import (
    ServiceSpec,
    StackPorts,
    Topology,
    free_port,
    sequential_ports,
    service_role,
    stack_specs,
    topology_specs,
)

log = structlog.get_logger(__name__)

# The stack's description lives in services.topology; importers of these names from here
# (tests, benchmarks) keep working.
__all__ = [
    "PARENT_ENV",
    "Launcher",
    "ServiceSpec",
    "StackPorts",
    "StartupFailure",
    "Topology",
    "check_ready",
    "end_group",
    "free_port",
    "health_channel",
    "sequential_ports",
    "service_role",
    "stack_specs",
    "topology_specs",
]

PARENT_ENV = "RADIXMESH_PARENT_PID"


class StartupFailure(RuntimeError):
    """A service cannot start (port taken, or it dies before getting ready, repeatedly); the
    message says which and why."""


def health_channel(address: str, tls: CertFiles | None = None) -> grpc.aio.Channel:
    """A channel for health checks: mutual TLS with `tls` (the launcher's own certificate)."""
    return internal_channel(address, tls.internal() if tls is not None else None)


async def check_ready(
    address: str,
    service: str = "readiness",
    timeout: float = 1.0,
    tls: CertFiles | None = None,
) -> bool:
    try:
        async with health_channel(address, tls) as chan:
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
        max_startup_failures: int = 3,
        internal_tls: bool = False,
        liveness_timeout_s: float = 10.0,
    ) -> None:
        """`internal_tls`: make an ephemeral CA and run every internal link over mutual TLS
        (each service gets a certificate naming its role; the files live in a 0700 temporary
        directory removed by `stop_all`)."""
        self.specs = {s.name: s for s in specs}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: dict[str, int] = {s.name: 0 for s in specs}
        # Output always goes to a file: its tail explains a death (see _report_death). Without
        # a log_dir, a temporary folder made when the first service starts.
        self._log_dir = log_dir
        self._own_log_dir = False  # made by us (a temporary folder): removed on a clean stop
        self.deaths = 0  # services that died unasked (each reported with its log's tail)
        # Services watch this pid and stop when the launcher is gone (services.server).
        self.env = {**os.environ, **(env or {}), PARENT_ENV: str(os.getpid())}
        self.max_backoff = max_backoff
        self.liveness_timeout_s = liveness_timeout_s
        # Liveness is probed only once a service has answered SERVING since its (re)start: a
        # model loading its weights does not serve health yet.
        self._seen_live: set[str] = set()
        self._unlive_since: dict[str, float] = {}
        self._next_probe = 0.0
        self._stopping = False
        self._logs: list[Any] = []
        self.max_startup_failures = max_startup_failures
        self._log_start: dict[str, int] = {}  # log offset where the current process began
        self._ready: dict[str, bool] = {}  # has the current process been ready yet?
        self._early_deaths: dict[str, int] = {s.name: 0 for s in specs}  # in a row, pre-ready
        self._next_check: dict[str, float] = {}
        self.pki_dir: Path | None = None
        self.pki: dict[str, CertFiles] = {}
        if internal_tls:
            self.pki_dir = Path(tempfile.mkdtemp(prefix="radixmesh-pki-"))
            # One certificate per role (peers authorise by role: "scheduler"), shared by the
            # replicas of a kind ("scheduler-0", "scheduler-1").
            roles = dict.fromkeys([*map(service_role, self.specs), "launcher", "client"])
            self.pki = make_local_pki(self.pki_dir, list(roles))

    def _service_env(self, name: str) -> dict[str, str]:
        files = self.pki.get(service_role(name))
        env = {**self.env, **self.specs[name].env}
        if files is None:
            return env
        return {
            **env,
            "RADIXMESH_MTLS_CA": str(files.ca),
            "RADIXMESH_MTLS_CERT": str(files.cert),
            "RADIXMESH_MTLS_KEY": str(files.key),
        }

    def start(self, name: str) -> None:
        spec = self.specs[name]
        cmd = [sys.executable, "-m", spec.module, "--port", str(spec.port), *spec.args]
        if spec.health_port:
            cmd += ["--health-port", str(spec.health_port)]
        self._log_start[name] = log_size(self.log_path(name))
        self._ready[name] = False
        out = self._open_log(name)
        self._seen_live.discard(name)
        self._unlive_since.pop(name, None)
        self.procs[name] = subprocess.Popen(
            cmd, env=self._service_env(name), stdout=out, stderr=out, start_new_session=True
        )
        log.info("service_started", service=name, pid=self.procs[name].pid, port=spec.port)

    @property
    def log_dir(self) -> Path:
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="radixmesh-"))
            self._own_log_dir = True
        return self._log_dir

    @property
    def log_folder(self) -> Path | None:
        """The log folder if one was given or made yet (`log_dir` makes one)."""
        return self._log_dir

    @property
    def logs_kept(self) -> bool:
        """Are the logs still there after `stop_all`? A temporary folder of our own goes
        when every service stopped without a death to explain (else they piled up in /tmp);
        a given `log_dir` always stays."""
        return not self._own_log_dir or self.deaths > 0

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _open_log(self, name: str) -> Any:
        """Service logs are for the operator alone: created 0600 in a 0700 directory."""
        if make_private_dir(self.log_dir):
            log.warning("log_dir_tightened", path=str(self.log_dir), mode="0700")
        fd = os.open(self.log_path(name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        f = os.fdopen(fd, "ab")
        self._logs.append(f)
        return f

    def port_uses(self) -> list[PortUse]:
        return [use for spec in self.specs.values() for use in spec.port_uses()]

    def check_ports(self) -> None:
        """Every port of every service must be free (gRPC, health, HTTP, /metrics): a port held
        by another process would answer our health checks and make a stack that cannot serve
        look ready, or kill a service at bind."""
        problem = first_problem(self.port_uses())
        if problem is not None:
            raise StartupFailure(problem)

    def start_all(self) -> None:
        self.check_ports()
        for name in self.specs:
            self.start(name)

    def _report_death(self, name: str, when: str) -> str:
        self.deaths += 1
        proc = self.procs[name]
        report = death_report(
            name, proc.returncode, self.log_path(name), self._log_start.get(name, 0), when
        )
        print(report, file=sys.stderr, flush=True)
        return report

    async def wait_ready(
        self,
        timeout: float = 300.0,
        names: Sequence[str] | None = None,
        fail_on_exit: bool = True,
        progress: Callable[[str, list[str], float], None] | None = None,
    ) -> None:
        """Until every named service reports readiness. `fail_on_exit=False` while `supervise`
        is running: a dead process is then about to be restarted, not a start-up failure.
        `progress(event, pending, elapsed_s)` hears "ready:NAME" as each one gets ready and
        "waiting" every few seconds."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        pending = list(names or self.specs)
        next_note = t0 + 5.0
        while pending:
            for name in list(pending):
                proc = self.procs.get(name)
                if fail_on_exit and proc is not None and proc.poll() is not None:
                    self._report_death(name, "during start-up")
                    raise StartupFailure(
                        f"service {name} exited with code {proc.returncode} during start-up "
                        f"(its last lines are above; full log: {self.log_path(name)})"
                    )
                if await check_ready(self.specs[name].probe_address, tls=self.probe_tls(name)):
                    pending.remove(name)
                    self._mark_ready(name)
                    if progress:
                        progress(f"ready:{name}", pending, time.monotonic() - t0)
            if progress and pending and time.monotonic() >= next_note:
                progress("waiting", pending, time.monotonic() - t0)
                next_note += 5.0
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"services not ready after {timeout:.0f}s: {pending}")
            if pending:
                await asyncio.sleep(0.2)

    def probe_tls(self, name: str) -> CertFiles | None:
        """Credentials for a health check of `name`: internal ports only speak mutual TLS."""
        spec = self.specs[name]
        return None if spec.public or spec.health_port else self.pki.get("launcher")

    def _mark_ready(self, name: str) -> None:
        self._ready[name] = True
        self._early_deaths[name] = 0

    async def _track_readiness(self) -> None:
        """Note when a restarted process gets ready (one health check per 0.5 s each), so that
        a death before that counts as a start-up failure."""
        now = time.monotonic()
        for name, proc in self.procs.items():
            if self._ready.get(name, True) or proc.poll() is not None:
                continue
            if now >= self._next_check.get(name, 0.0):
                self._next_check[name] = now + 0.5
                spec = self.specs[name]
                if await check_ready(spec.probe_address, timeout=0.5, tls=self.probe_tls(name)):
                    self._mark_ready(name)

    def _check_restartable(self, name: str) -> None:
        """Raise StartupFailure where a restart cannot help: the port is now someone else's,
        or the service died before getting ready max_startup_failures times in a row."""
        spec = self.specs[name]
        if not self._ready.get(name, True):
            self._early_deaths[name] += 1
        n = self._early_deaths[name]
        reason = ""
        if n >= self.max_startup_failures:
            reason = f"it died {n} times in a row before getting ready; not restarting it"
        host = spec.address.rsplit(":", 1)[0]
        if port_in_use(host, spec.port, spec.shared_port):
            reason = port_message(name, host, spec.port)
        if reason:
            raise StartupFailure(
                f"service {name} cannot be restarted: {reason} (full log: {self.log_path(name)})"
            )

    async def supervise(self) -> None:
        """Restart services that die, with exponential backoff per service; raise
        StartupFailure for a failure that a restart cannot fix (see _check_restartable)."""
        while not self._stopping:
            await self._track_readiness()
            for name, proc in list(self.procs.items()):
                if proc.poll() is not None and not self._stopping:
                    ready = self._ready.get(name, True)
                    self._report_death(name, "while serving" if ready else "before getting ready")
                    self._check_restartable(name)
                    n = self.restarts[name] = self.restarts[name] + 1
                    delay = min(0.25 * 2 ** (n - 1), self.max_backoff)
                    log.warning(
                        "service_died",
                        service=name,
                        code=proc.returncode,
                        restart_in_s=delay,
                        restarts=n,
                    )
                    end_group(proc)  # its helpers (a forkserver) go with it
                    await asyncio.sleep(delay)
                    if not self._stopping:
                        self.start(name)
            if time.monotonic() >= self._next_probe:
                self._next_probe = time.monotonic() + 1.0
                await self._probe_liveness()
            await asyncio.sleep(0.1)

    async def _probe_liveness(self) -> None:
        """SIGKILL a service whose liveness has failed (no answer within 2 s, or NOT_SERVING)
        for `liveness_timeout_s`; the supervise loop then restarts it."""
        names = [n for n, p in self.procs.items() if p.poll() is None]
        oks = await asyncio.gather(
            *(
                check_ready(
                    self.specs[n].probe_address, "liveness", timeout=2.0, tls=self.probe_tls(n)
                )
                for n in names
            )
        )
        now = time.monotonic()
        for name, ok in zip(names, oks, strict=True):
            if ok:
                self._seen_live.add(name)
                self._unlive_since.pop(name, None)
                continue
            if name not in self._seen_live or self._stopping:
                continue
            since = self._unlive_since.setdefault(name, now)
            if now - since >= self.liveness_timeout_s:
                log.error("service_unresponsive", service=name, for_s=round(now - since, 1))
                with contextlib.suppress(ProcessLookupError):
                    self.procs[name].kill()
                self._seen_live.discard(name)
                self._unlive_since.pop(name, None)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        proc = self.procs[name]
        proc.send_signal(sig)
        return proc.pid

    def stop_all(self, grace: float = 5.0) -> None:
        """SIGTERM every service (each drains: services.drain); SIGKILL what is still
        running `grace` seconds later."""
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
            end_group(proc)
        for f in self._logs:
            f.close()
        if self.pki_dir is not None:
            shutil.rmtree(self.pki_dir, ignore_errors=True)
        if self._log_dir is not None and not self.logs_kept:
            shutil.rmtree(self._log_dir, ignore_errors=True)


def end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL what is left of a stopped service's process group (each service leads its own
    session: start_new_session). A service's helpers, such as the grammar service's compile
    forkserver and its workers, must not outlive the service and its launcher. Call only
    after `proc` has exited and been reaped: its group id is then held by such leftovers
    alone, so it cannot name anyone else's processes."""
    assert proc.returncode is not None, "end_group of a running service"
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
