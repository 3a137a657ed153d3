"""grpc.aio server bootstrap shared by every service.

Health (grpc.health.v1): service "" and "liveness" report only that the process serves;
"readiness" is SERVING only while every peer the service needs is reachable (the service calls
`Health.set_ready`). Reflection lists every registered service. SIGTERM/SIGINT: readiness goes
NOT_SERVING, new RPCs are refused, in-flight work drains for `grace_s`.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from radixmesh_server.security import internal_tls

log = structlog.get_logger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_SIZE = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# Internal streams live for hours; client keepalive pings notice a dead peer that never closed
# its socket, and servers must accept those pings (the default would answer GOAWAY).
CHANNEL_OPTIONS = [
    *_SIZE,
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Peers restart in seconds: keep reconnect backoff short (gRPC's default grows to 120 s,
    # failing calls fast meanwhile).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
SERVER_OPTIONS = [
    *_SIZE,
    ("grpc.so_reuseport", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
    # Calls that arrived but that the asyncio server has not picked up yet: past gRPC's
    # default of 1,000 the core cancels them (CANCELLED), which a burst of 2,000 streams at
    # request rate inf hits. Admission is bounded by the scheduler's --max-queue instead.
    ("grpc.server.max_pending_requests", 65_536),
    ("grpc.server.max_pending_requests_hard_limit", 65_536),
]
LIVENESS = "liveness"
READINESS = "readiness"


class Health:
    """Wraps the aio health servicer with the liveness/readiness split."""

    def __init__(self) -> None:
        self.servicer = health.aio.HealthServicer()
        self.ready = False

    async def start(self) -> None:
        for name in ("", LIVENESS):
            await self.servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        await self.servicer.set(READINESS, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def set_ready(self, ready: bool, reason: str = "") -> None:
        if ready != self.ready:
            log.info("readiness", ready=ready, reason=reason)
        self.ready = ready
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ready
            else (health_pb2.HealthCheckResponse.NOT_SERVING)
        )
        await self.servicer.set(READINESS, status)

    async def shutdown(self) -> None:
        await self.set_ready(False, "shutting down")
        await self.servicer.enter_graceful_shutdown()


async def _stop_when_orphaned(stop: asyncio.Event) -> None:
    """A service started by the local launcher stops when the launcher is gone (killed test
    runs must not leave services behind). In Kubernetes the variable is unset: no-op."""
    parent = os.environ.get("RADIXMESH_PARENT_PID")
    if not parent:
        return
    while os.getppid() == int(parent):
        await asyncio.sleep(1.0)
    log.warning("launcher_gone", parent=parent)
    stop.set()


def channel(target: str) -> grpc.aio.Channel:
    """A channel to an internal peer: mutual TLS when the process has internal credentials."""
    tls = internal_tls()
    if tls is None:
        return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(
        target, tls.channel_credentials(), options=[*CHANNEL_OPTIONS, *tls.channel_options()]
    )


@dataclass(frozen=True)
class Listen:
    """How a server's port is exposed. Internal services leave it at the default (mutual TLS
    when configured); the front door passes its public TLS (or None: plaintext) and its API-key
    interceptor. `health_port` > 0 adds a plaintext port serving only grpc.health.v1."""

    public: bool = False
    credentials: grpc.ServerCredentials | None = None
    interceptors: tuple[grpc.aio.ServerInterceptor, ...] = ()
    health_port: int = 0


async def _health_only_server(host: str, port: int, hb: Health) -> grpc.aio.Server:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    health_pb2_grpc.add_HealthServicer_to_server(hb.servicer, server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise SystemExit(f"cannot listen on {host}:{port} for health probes (port in use?)")
    await server.start()
    return server


async def run_server(
    name: str,
    host: str,
    port: int,
    register: Callable[[grpc.aio.Server, Health], Iterable[str]],
    background: Callable[[Health], Coroutine[Any, Any, None]] | None = None,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    grace_s: float = 5.0,
    listen: Listen | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. `register` adds servicers and returns their full names;
    `background` runs alongside (peer links that flip readiness); `on_stop` runs after draining."""
    listen = listen or Listen()
    server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=listen.interceptors)
    hb = Health()
    names = list(register(server, hb))
    health_pb2_grpc.add_HealthServicer_to_server(hb.servicer, server)
    reflection.enable_server_reflection(
        [
            *names,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    creds = listen.credentials
    tls = internal_tls()
    if not listen.public and tls is not None:
        creds = tls.server_credentials()
    address = f"{host}:{port}"
    try:
        bound = (
            server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
        )
    except RuntimeError:  # grpcio raises where older versions returned 0
        bound = 0
    if bound == 0:
        # One line naming the address, then exit 1: the launcher shows it (log tail) and does
        # not restart into the same wall.
        log.error("cannot_listen", address=f"{host}:{port}", reason="address in use or not local")
        raise SystemExit(f"{name}: cannot listen on {host}:{port}: address in use or not local")
    await server.start()
    await hb.start()
    probes = await _health_only_server(host, listen.health_port, hb) if listen.health_port else None
    log.info("listening", address=f"{host}:{bound}", services=names, tls=creds is not None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bg = asyncio.create_task(background(hb)) if background else None
    orphan = asyncio.create_task(_stop_when_orphaned(stop))
    if background is None:
        await hb.set_ready(True, "no peers needed")
    await stop.wait()
    orphan.cancel()
    log.info("draining", grace_s=grace_s)
    await hb.shutdown()
    await server.stop(grace_s)
    if probes is not None:
        await probes.stop(0)
    if bg:
        bg.cancel()
    if on_stop:
        await on_stop()
    log.info("stopped")


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    # uvloop was measured to make no difference to our gRPC hops (docs/architecture.md).
    asyncio.run(main())
