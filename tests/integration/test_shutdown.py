"""SIGTERM to `radixmesh serve` drains (issue 13): 16 requests in flight; those that fit the
grace period finish normally, the rest end with UNAVAILABLE and a message, every process exits.
Starts its own `radixmesh serve` process (the launcher under test)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from radixmesh.api import Client, GenerateResult, RadixMeshError
from radixmesh.retry import NO_RETRY

from services.launcher import check_ready, free_port

pytestmark = pytest.mark.integration

GRACE = 10.0
SHORT, LONG = 8, 3000  # a short one fits the grace even on a loaded 2-core box


def _free_base() -> int:
    """Four consecutive free ports (serve uses port .. port+3)."""
    for _ in range(200):
        base = random.randint(20_000, 60_000)
        try:
            for p in range(base, base + 4):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise RuntimeError("no four consecutive free ports")


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _answers(endpoint: str) -> bool:
    if not asyncio.run(check_ready(endpoint)):
        return False
    try:
        with Client(endpoint, timeout=30, retry=NO_RETRY) as c:
            return c.generate("Hi", max_new_tokens=1).completion_tokens == 1
    except RadixMeshError:
        return False


def _until(cond, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return bool(cond())


def test_sigterm_drains_then_everything_exits(tmp_path: Path, model_dir: Path) -> None:
    base = _free_base()
    cmd = [sys.executable, "-m", "services.cli", "serve", "--port", str(base)]
    cmd += ["--kv-tokens", "65536", "--no-smoke", "--shutdown-grace", str(GRACE)]
    cmd += ["--log-dir", str(tmp_path), "--http-port", str(free_port())]
    serve = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # Internal ports speak mutual TLS under `serve`: readiness of the whole stack is a
        # request through the front door that succeeds.
        assert _until(lambda: _answers(f"127.0.0.1:{base}"), 300)
        services = _children(serve.pid)
        assert len(services) == 4, services
        progress = [0] * 16
        with Client(f"127.0.0.1:{base}", retry=NO_RETRY) as c:

            def one(i: int) -> GenerateResult:
                n = SHORT if i % 2 == 0 else LONG
                for item in c.stream(f"Story {i}:", max_new_tokens=n, ignore_eos=True):
                    if isinstance(item, GenerateResult):
                        return item
                    progress[i] += len(item.token_ids)
                raise AssertionError("no result")

            pool = ThreadPoolExecutor(16)
            futs: dict[int, Future[GenerateResult]] = {}
            for first in (1, 0):  # long ones first, so every short one is mid-stream too
                futs.update({i: pool.submit(one, i) for i in range(first, 16, 2)})
                started = _until(lambda f=first: min(progress[f::2]) >= 1, 120)
                errors = {i: repr(f.exception()) for i, f in futs.items() if f.done()}
                assert started, (progress, errors)
            assert max(progress[::2]) < SHORT  # every request is still in flight
            t0 = time.monotonic()
            serve.send_signal(signal.SIGTERM)
            for i, f in sorted(futs.items()):
                if i % 2 == 0:  # fits the grace: finishes normally
                    res = f.result(timeout=GRACE + 10)
                    assert res.completion_tokens == SHORT and res.finish_reason == "length"
                else:  # does not: ends cleanly with a status a person can act on
                    with pytest.raises(RadixMeshError) as err:
                        f.result(timeout=GRACE + 10)
                    assert err.value.code == grpc.StatusCode.UNAVAILABLE, err.value
                    assert "shutting down" in err.value.message
            ended = time.monotonic() - t0
            # Not cut before the grace (a busy machine only lengthens this); how long past it
            # is a figure.
            assert ended > GRACE - 1.5, ended  # lower bound: load only adds time
            print(f"drain ended {ended:.1f} s after SIGTERM (grace {GRACE} s)")
        assert serve.wait(timeout=GRACE + 20) == 0
        assert _until(lambda: not any(_alive(p) for p in services), 10)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
