"""free_port draws outside the kernel's ephemeral range on every shape of that range: a port
inside it can be taken by an outgoing connection between the draw and the service's bind."""

from __future__ import annotations

import pytest

from services import topology
from services.topology import free_port, quiet_ports


@pytest.mark.parametrize(
    ("ephemeral", "expected"),
    [
        ((32768, 60999), range(10_000, 32768)),  # Linux's default
        ((1024, 65535), range(10_000, 10_000)),  # nothing left: the bind-to-0 fallback
        ((10000, 20000), range(20001, 65536)),
    ],
)
def test_quiet_ports_avoid_the_ephemeral_range(ephemeral: tuple[int, int], expected: range) -> None:
    assert quiet_ports(ephemeral) == expected


def test_quiet_ports_take_the_larger_side() -> None:
    assert quiet_ports((15000, 61000)) == range(10_000, 15000)  # 5,000 below, 4,535 above
    assert quiet_ports((12000, 50000)) == range(50001, 65536)


def test_free_port_follows_the_machines_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topology, "_ephemeral_range", lambda: (10000, 20000))
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20
    assert all(20001 <= p <= 65535 for p in ports)
