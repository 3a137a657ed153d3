"""grpc.aio server bootstrap shared by every service.

Health (grpc.health.v1): service "" and "liveness" report that the process serves and that its
loops make progress (services.watchdog);
"readiness" is SERVING only while every peer the service needs is reachable (the service calls
`Health.set_ready`). Reflection lists every registered service. SIGTERM/SIGINT: readiness goes
NOT_SERVING, new RPCs are refused, in-flight work drains for `grace_s` (services.drain).
Every server refuses a request that is not a valid protobuf message (or holds invalid UTF-8 in
a string field) with INVALID_ARGUMENT (`StrictDecoding`), never UNKNOWN. Message sizes are
bounded (`MAX_MESSAGE_BYTES`, chosen below; the front door receives less). A service started by
the launcher exits when the launcher is gone, even when its event loop is stuck (a thread
watches the parent, and forces the exit if the loop does not stop in time).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.drain import DEFAULT_GRACE_S, drain
from services.security import internal_channel, internal_tls
from services.watchdog import Watchdog

log = structlog.get_logger(__name__)

# The largest internal messages are a step's masks (rows x vocab/8 bytes: 256 rows of a
# 152k vocabulary are 5 MB) and a long prompt's logprobs relayed to the front door (~20 MB for
# 100k tokens x 20 top logprobs): 32 MiB covers both and bounds what one peer can make us buffer.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
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
    # Ping each client every 10 s: a peer that vanished without closing its connection is
    # noticed in seconds, and its calls (a scheduler's step session) end with it.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
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

    async def set_live(self, live: bool, reason: str = "") -> None:
        """Liveness (the watchdog's verdict): NOT_SERVING asks the supervisor to restart us."""
        if not live:
            log.error("liveness", live=live, reason=reason)
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if live
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", LIVENESS):
            await self.servicer.set(name, status)

    async def shutdown(self) -> None:
        await self.set_ready(False, "shutting down")
        await self.servicer.enter_graceful_shutdown()


ORPHAN_POLL_S = 0.5
ORPHAN_EXIT_CODE = 70


def watch_parent(
    loop: asyncio.AbstractEventLoop, stop: asyncio.Event, grace_s: float
) -> threading.Thread | None:
    """A service started by the local launcher stops when the launcher is gone (killed test
    runs must not leave services behind). In Kubernetes the variable is unset: no watch.

    Why a thread and not a task: a loop stuck in native code (an xgrammar call that never
    returns) never runs a task, so the thread asks the loop to stop and, if the process is
    still here `grace_s` + 5 s later, exits it with os._exit. Not PR_SET_PDEATHSIG: it fires
    when the parent *thread* that forked us exits, and the launcher restarts services from a
    supervisor thread. (Compile workers, whose parent is ours, do use it.)"""
    parent = os.environ.get("RADIXMESH_PARENT_PID")
    if not parent:
        return None

    def watch() -> None:
        while os.getppid() == int(parent):
            threading.Event().wait(ORPHAN_POLL_S)
        log.warning("launcher_gone", parent=parent)
        loop.call_soon_threadsafe(stop.set)
        threading.Event().wait(grace_s + 5.0)
        log.error("orphan_forced_exit", parent=parent)
        os._exit(ORPHAN_EXIT_CODE)

    t = threading.Thread(target=watch, name="parent-watch", daemon=True)
    t.start()
    return t


class _Undecodable:
    """Stands in for a request whose bytes did not parse (see StrictDecoding)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class StrictDecoding(grpc.aio.ServerInterceptor):
    """Requests that are not valid protobuf (or hold invalid UTF-8 in a string field) get
    INVALID_ARGUMENT with the parser's reason; grpc's own answer is UNKNOWN. Covers methods
    with a single request message (every public method); streams parse as before."""

    def __init__(self) -> None:
        self._cache: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        method = details.method
        wrapped = self._cache.get(method)
        if wrapped is None:
            wrapped = self._cache[method] = _strict(handler, method)
        return wrapped


def _strict(handler: Any, method: str) -> Any:
    parse = handler.request_deserializer

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except (DecodeError, UnicodeDecodeError, ValueError) as exc:
            return _Undecodable(exc)

    async def refuse(request: _Undecodable, context: grpc.aio.ServicerContext) -> None:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{method}: the request is not a valid protobuf message ({request.error}); "
            "string fields must be valid UTF-8",
        )

    if handler.response_streaming:
        inner_stream = handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, _Undecodable):
                await refuse(request, context)
            async for item in inner_stream(request, context):
                yield item

        return handler._replace(request_deserializer=deserialize, unary_stream=stream)
    inner = handler.unary_unary

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            await refuse(request, context)
        return await inner(request, context)

    return handler._replace(request_deserializer=deserialize, unary_unary=unary)


def channel(target: str) -> grpc.aio.Channel:
    """A channel to an internal peer: mutual TLS when the process has internal credentials."""
    return internal_channel(target, internal_tls(), CHANNEL_OPTIONS)


@dataclass(frozen=True)
class Listen:
    """How a server's port is exposed. Internal services leave it at the default (mutual TLS
    when configured); the front door passes its public TLS (or None: plaintext) and its API-key
    interceptor. `health_port` > 0 adds a plaintext port serving only grpc.health.v1."""

    public: bool = False
    credentials: grpc.ServerCredentials | None = None
    interceptors: tuple[grpc.aio.ServerInterceptor, ...] = ()
    health_port: int = 0
    # SO_REUSEPORT on the main port: several processes (front doors) bind it and the kernel
    # spreads the connections over them.
    reuse_port: bool = False


async def _health_only_server(host: str, port: int, hb: Health) -> grpc.aio.Server:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    health_pb2_grpc.add_HealthServicer_to_server(hb.servicer, server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise SystemExit(f"cannot listen on {host}:{port} for health probes (port in use?)")
    await server.start()
    return server


def _server_options(listen: Listen, max_receive_bytes: int) -> list[tuple[str, int]]:
    """SERVER_OPTIONS with this server's receive bound (0: MAX_MESSAGE_BYTES) and SO_REUSEPORT."""
    options = list(SERVER_OPTIONS)
    if max_receive_bytes:  # replace, not append: grpc takes the first value of a key
        key = "grpc.max_receive_message_length"
        options = [o for o in options if o[0] != key] + [(key, max_receive_bytes)]
    if listen.reuse_port:
        options = [o for o in options if o[0] != "grpc.so_reuseport"] + [("grpc.so_reuseport", 1)]
    return options


def _add_services(
    server: grpc.aio.Server,
    hb: Health,
    register: Callable[[grpc.aio.Server, Health], Iterable[str]],
) -> list[str]:
    """The service's own servicers, then health and reflection (listing all of them); returns
    the service's own full names."""
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
    return names


def _bind(
    server: grpc.aio.Server, name: str, host: str, port: int, listen: Listen
) -> tuple[int, grpc.ServerCredentials | None]:
    """Add the main port (the public TLS given, internal mutual TLS when configured, else
    plaintext): the port bound and the credentials used. Exits naming the address when it
    cannot be bound."""
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
    return bound, creds


async def run_server(
    name: str,
    host: str,
    port: int,
    register: Callable[[grpc.aio.Server, Health], Iterable[str]],
    background: Callable[[Health], Coroutine[Any, Any, None]] | None = None,
    watchdog: Watchdog | None = None,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    before_cancel: Callable[[], None] | None = None,
    listen: Listen | None = None,
    max_receive_bytes: int = 0,
) -> None:
    """Serve until SIGTERM/SIGINT. `register` adds servicers and returns their full names;
    `background` runs alongside (peer links that flip readiness); `on_stop` runs after draining;
    `before_cancel` ends in-flight work cleanly when the grace period runs out; `watchdog`
    (services.watchdog) turns liveness NOT_SERVING when a loop is stuck, and the
    `background` task ending counts as dead; `listen` says how the port is exposed (TLS,
    interceptors, a plaintext health-only port); `max_receive_bytes` (0: MAX_MESSAGE_BYTES)
    bounds request messages (the public front door takes less than peers send each other)."""
    listen = listen or Listen()
    # StrictDecoding last (innermost): it caches its wrapper per method, so it must only ever
    # wrap the real handler, never a per-call refusal of the API-key interceptor.
    interceptors = [*listen.interceptors, StrictDecoding()]
    server = grpc.aio.server(
        options=_server_options(listen, max_receive_bytes), interceptors=interceptors
    )
    hb = Health()
    names = _add_services(server, hb, register)
    bound, creds = _bind(server, name, host, port, listen)
    await server.start()
    await hb.start()
    probes = await _health_only_server(host, listen.health_port, hb) if listen.health_port else None
    log.info("listening", address=f"{host}:{bound}", services=names, tls=creds is not None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bg = asyncio.create_task(background(hb)) if background else None
    dog = watchdog or Watchdog()
    if bg is not None:
        dog.task("background loop", bg)
    dog_task = asyncio.create_task(dog.run(hb))
    watch_parent(loop, stop, grace_s)
    if background is None:
        await hb.set_ready(True, "no peers needed")
    await stop.wait()
    dog_task.cancel()
    log.info("draining", grace_s=grace_s)
    await hb.shutdown()
    await drain(server, grace_s, before_cancel)
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
