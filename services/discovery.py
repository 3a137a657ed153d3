"""Where a service's peers are: a fixed list, a DNS name, or a file, re-read while running.

An address spec is one of
  host:port[,host:port...]   a fixed list (a local stack: `radixmesh serve --replicas N`);
  dns:///name:port           every address the name resolves to, re-resolved every
                             `interval_s` (a Kubernetes headless Service: one address per
                             ready pod; pods that come and go are picked up);
  file:PATH                  one host:port per line ('#' comments), re-read every `interval_s`
                             (a mounted ConfigMap, or a test that adds a replica).

`Discovery.watch()` yields the current set whenever it changes (first the initial set, which
may be empty when a name does not resolve yet). Parsing is strict: a spec that cannot name any
address raises ValueError with a message a person can act on, at start-up.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

Resolver = Callable[[str, int], Awaitable[list[str]]]  # (host, port) -> ["ip:port", ...]


@dataclass(frozen=True)
class AddressSpec:
    kind: str  # "static" | "dns" | "file"
    addresses: tuple[str, ...] = ()  # static
    host: str = ""  # dns
    port: int = 0  # dns
    path: str = ""  # file

    @property
    def dynamic(self) -> bool:
        return self.kind != "static"


def parse_address_spec(spec: str) -> AddressSpec:
    spec = spec.strip()
    if spec.startswith("dns:"):
        rest = spec.removeprefix("dns:").lstrip("/")
        host, port = _split_host_port(rest, spec)
        return AddressSpec("dns", host=host, port=port)
    if spec.startswith("file:"):
        path = spec.removeprefix("file:")
        if not path:
            raise ValueError(f"{spec!r}: file: needs a path (file:/etc/radixmesh/replicas)")
        return AddressSpec("file", path=path)
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise ValueError(
            "no address given: use host:port[,host:port...], dns:///name:port or file:PATH"
        )
    for p in parts:
        _split_host_port(p, spec)
    return AddressSpec("static", addresses=tuple(dict.fromkeys(parts)))


def _split_host_port(text: str, spec: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{spec!r}: expected host:port (e.g. 127.0.0.1:50052), got {text!r}")
    return host.strip("[]"), int(port)


async def resolve_dns(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out = []
    for family, _, _, _, addr in infos:
        ip = addr[0]
        out.append(f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}")
    return sorted(set(out))


def read_address_file(path: str) -> list[str]:
    out = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            _split_host_port(line, f"file:{path}")
            out.append(line)
    return sorted(set(out))


class Discovery:
    def __init__(
        self, spec: AddressSpec, interval_s: float = 5.0, resolver: Resolver = resolve_dns
    ) -> None:
        self.spec = spec
        self.interval_s = interval_s
        self.resolver = resolver

    async def current(self) -> list[str] | None:
        """The addresses now; None when they cannot be read (keep the last known set)."""
        s = self.spec
        try:
            if s.kind == "static":
                return list(s.addresses)
            if s.kind == "dns":
                return await self.resolver(s.host, s.port)
            return await asyncio.to_thread(read_address_file, s.path)
        except (OSError, ValueError) as exc:
            log.warning("discovery_failed", spec=s.kind, error=str(exc))
            return None

    async def watch(self) -> AsyncIterator[list[str]]:
        last: list[str] | None = None
        while True:
            now = await self.current()
            if now is None and last is None:
                now = []  # nothing known yet: say so, keep trying
            if now is not None and now != last:
                last = now
                yield now
            if not self.spec.dynamic:
                return
            await asyncio.sleep(self.interval_s)
