"""Several front doors on one address (issue 27): with --reuse-port two front-door processes
bind the same public gRPC port and HTTP port (SO_REUSEPORT) and both serve; without it a
second one cannot bind them and exits with a message naming the port."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from services.launcher import check_ready, free_port

pytestmark = pytest.mark.integration


def _front_door(port: int, http_port: int, health_port: int, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokenizer_service",
            "--port",
            str(port),
            "--http-port",
            str(http_port),
            "--health-port",
            str(health_port),
            "--scheduler-address",
            f"127.0.0.1:{free_port()}",  # none there: liveness does not need one
            "--log-level",
            "warning",
            *flags,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _alive(health_port: int, proc: subprocess.Popen, timeout: float = 180.0) -> bool:
    """Liveness SERVING on the process's own health port (it listens there only after it
    bound its public ports), or False once the process has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if asyncio.run(check_ready(f"127.0.0.1:{health_port}", service="liveness")):
            return True
        time.sleep(0.3)
    return False


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.terminate()
    for p in started:
        p.communicate(timeout=60)


def test_two_front_doors_share_the_ports(procs: list[subprocess.Popen]) -> None:
    port, http_port = free_port(), free_port()
    health = [free_port() for _ in range(3)]
    procs += [_front_door(port, http_port, health[i], "--reuse-port") for i in range(2)]
    assert all(_alive(health[i], procs[i]) for i in range(2))
    # Without the flag a third cannot bind the ports the two hold.
    third = _front_door(port, http_port, health[2])
    procs.append(third)
    _, err = third.communicate(timeout=180)
    assert third.returncode != 0 and str(http_port) in err
    assert all(p.poll() is None for p in procs[:2])  # the two still serve
