"""Is a TCP port free to listen on? Checked before the launcher starts (or restarts) a service:
a second stack on ports in use would otherwise look ready (the first stack answers its health
checks) while its own services die at bind."""

from __future__ import annotations

import socket


def port_in_use(host: str, port: int) -> bool:
    """True when nothing could listen on host:port now. SO_REUSEADDR as gRPC sets it, so a
    socket of a just-stopped process in TIME_WAIT does not count as in use."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def port_message(service: str, host: str, port: int) -> str:
    return (
        f"port {port} on {host} (the {service} service's) is already in use by another process "
        "(another `radixmesh serve`?): stop it, or start on other ports with --port"
    )
