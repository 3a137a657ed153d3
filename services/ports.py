"""Is a TCP port free to listen on? Checked before the launcher starts (or restarts) a service,
and by `radixmesh serve` for every port of its plan before anything slow: a second stack on
ports in use would otherwise look ready (the first stack answers its health checks) while its
own services die at bind, or die only after minutes of model preparation."""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass


def port_in_use(host: str, port: int, shared: bool = False) -> bool:
    """True when nothing could listen on host:port now. SO_REUSEADDR as gRPC sets it, so a
    socket of a just-stopped process in TIME_WAIT does not count as in use. `shared`: the
    port is bound with SO_REUSEPORT by several of our processes (front doors), so siblings
    holding it leave it usable; a process holding it without SO_REUSEPORT does not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


@dataclass(frozen=True)
class PortUse:
    """One port a stack will bind: whose it is ("the tokenizer service's HTTP API") and the
    `radixmesh serve` flag that moves it."""

    port: int
    owner: str
    flag: str = "--port"
    shared: bool = False  # bound with SO_REUSEPORT by several front doors: may repeat


def port_message(service: str, host: str, port: int, flag: str = "--port") -> str:
    return in_use_message(PortUse(port, f"the {service} service's", flag), host)


def in_use_message(use: PortUse, host: str) -> str:
    return (
        f"port {use.port} on {host} ({use.owner}) is already in use by another process "
        f"(another `radixmesh serve`?): stop it, or pick another with {use.flag}"
    )


def first_problem(uses: Iterable[PortUse], host: str = "127.0.0.1") -> str | None:
    """Why this port plan cannot start, or None: a port given to two owners (flags whose
    ranges overlap), out of range, or in use now. Cheap (one bind per port): run it before
    anything slow."""
    seen: dict[int, PortUse] = {}
    for use in uses:
        if not 0 < use.port < 65536:
            return f"port {use.port} ({use.owner}) is not a TCP port: pick another with {use.flag}"
        other = seen.get(use.port)
        if other is not None and other.shared and use.shared and other.owner == use.owner:
            continue  # one address, several front doors
        if other is not None:
            return (
                f"port {use.port} would be both {other.owner} ({other.flag}) and {use.owner} "
                f"({use.flag}): move one of them"
            )
        seen[use.port] = use
    for use in seen.values():
        if port_in_use(host, use.port, use.shared):
            return in_use_message(use, host)
    return None
