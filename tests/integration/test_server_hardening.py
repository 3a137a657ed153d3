"""The shared server bootstrap under hostile input and a dead launcher (issue 12, items 13
and 15): undecodable requests are INVALID_ARGUMENT on every server, and a service whose
launcher died exits even while its event loop is stuck."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from services.server import MAX_MESSAGE_BYTES, SERVER_OPTIONS, StrictDecoding

pytestmark = pytest.mark.integration  # starts processes or real servers

CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"


@pytest.mark.parametrize(
    "payload",
    [b"\x0a\x02\xff\xfe", b"\xff\xff\xff\xff", b"\x0a\x10short"],
    ids=["invalid-utf8-string", "not-protobuf", "truncated"],
)
def test_undecodable_requests_are_invalid_argument(payload: bytes) -> None:
    async def main() -> None:
        server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=[StrictDecoding()])
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                unary = ch.unary_unary(CHECK)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await unary(payload, timeout=10)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "not a valid protobuf message" in (err.value.details() or "")
                stream = ch.unary_stream(WATCH)(payload, timeout=10)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in stream:
                        pass
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                # a valid request still works: b"" is an empty HealthCheckRequest
                await servicer.set("", 1)
                assert await unary(b"", timeout=10) == b"\x08\x01"
        finally:
            await server.stop(0)

    asyncio.run(main())


def test_message_size_is_chosen() -> None:
    assert MAX_MESSAGE_BYTES == 32 << 20
    assert ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES) in SERVER_OPTIONS


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in state


def test_orphan_exits_even_with_a_stuck_loop(tmp_path: Path) -> None:
    """The launcher is SIGKILLed while the service's loop is blocked: the parent-watch thread
    must still end the service (the old watch was a task on that loop and never ran)."""
    marker = tmp_path / "stuck"
    child = textwrap.dedent(
        f"""
        import asyncio, pathlib, time
        from services.server import run_server
        async def stuck(health):
            pathlib.Path({str(marker)!r}).write_text("x")
            time.sleep(600)  # the loop is blocked from here on
        asyncio.run(run_server("t", "127.0.0.1", 0, lambda s, h: [], background=stuck,
                               grace_s=0.5))
        """
    )
    parent = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        env = dict(os.environ, RADIXMESH_PARENT_PID=str(os.getpid()))
        p = subprocess.Popen([sys.executable, "-c", {child!r}], env=env)
        print(p.pid, flush=True)
        time.sleep(600)
        """
    )
    launcher = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    pid = int(launcher.stdout.readline())
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert time.monotonic() < deadline and _alive(pid), "service did not start"
            time.sleep(0.05)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 30
        while _alive(pid):
            assert time.monotonic() < deadline, "orphaned service still running"
            time.sleep(0.1)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        launcher.kill()
