"""`radixmesh serve` end to end as a person runs it (issue 26 item 3, issue 29's log flags, issue
30): with API keys it used to die on its own smoke request (UNAUTHENTICATED, a traceback, the
stack taken down) and refused `--api-keys`. Here it starts with keys, answers its smoke request
with one of them, keeps serving keyed callers, refuses a caller without a key with a message
that names `--api-key` and RADIXMESH_API_KEY, writes every service's log as JSON at the level
asked, and drains on SIGTERM with exit code 0."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from radixmesh.api import Client, RadixMeshError

from services.launcher import free_port
from services.ports import port_in_use

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a whole stack's start-up


def _free_block(n: int) -> int:
    for _ in range(100):
        base = free_port()
        if all(base + i < 65536 and not port_in_use("127.0.0.1", base + i) for i in range(n)):
            return base
    raise AssertionError("no block of free ports")


def _lines_until(proc: subprocess.Popen[str], marker: str, limit_s: float = 600) -> list[str]:
    """stdout lines up to the one holding `marker` (or the process's end). It reads the pipe's
    descriptor itself: select() on the buffered text reader missed lines the reader had
    already taken into its buffer (serve's last lines arriving together left "serving" unseen
    until the test timed out, with serve answering all along)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    text = ""
    deadline = time.monotonic() + limit_s
    while marker not in text:
        assert time.monotonic() < deadline, f"no {marker!r} in {limit_s:g} s: {text}"
        ready, _, _ = select.select([fd], [], [], 5)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break  # exited
            text += chunk.decode(errors="replace")
    return text.splitlines(keepends=True)


def test_serve_with_api_keys_smoke_answers_and_keeps_serving(tmp_path: Path) -> None:
    base = _free_block(6)  # the shared front-door address, 3 services, 2 health ports
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "services.cli", "serve", "--port", str(base), "--http-port"]
    cmd += ["0", "--api-keys", "k-one,k-two", "--log-dir", str(logs), "--log-format", "json"]
    cmd += ["--front-doors", "2"]
    cmd += ["--log-level", "debug", "--shutdown-grace", "5"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXMESH_API_KEY")}
    err_file = tmp_path / "serve.err"  # a file, not a pipe: nobody reads it while it runs
    with err_file.open("w") as err_out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_out, text=True, env=env)
    try:
        out = _lines_until(proc, "serving; Ctrl-C to stop.")
        text = "".join(out)
        assert proc.poll() is None, text  # still serving
        assert "radixmesh: smoke test\n" in text and "  < " in text, text
        endpoint = f"localhost:{base}"
        with Client(endpoint, api_key="k-two", timeout=120) as c:
            assert c.generate("Hello", max_new_tokens=2, temperature=0).completion_tokens == 2
        # One address, two front doors: each new connection goes to one of them (the kernel
        # hashes it), so 24 connections all reaching one has odds 2**-23.
        for _ in range(24):
            with Client(endpoint, api_key="k-one", timeout=120) as c:
                assert c.generate("Hi", max_new_tokens=1).completion_tokens == 1
        with Client(endpoint, api_key="", timeout=60) as c, pytest.raises(RadixMeshError) as err:
            c.generate("Hello", max_new_tokens=2)
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
        cli = subprocess.run(
            [sys.executable, "-m", "services.cli", "generate", "Hi", "--endpoint", endpoint],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert cli.returncode == 1
        assert "--api-key KEY" in cli.stderr and "RADIXMESH_API_KEY" in cli.stderr, cli.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
        err_text = err_file.read_text()
        assert "smoke request failed" not in err_text and "Traceback" not in err_text, err_text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    served = {}
    for name in ("tokenizer-0", "tokenizer-1", "scheduler", "model", "grammar"):
        lines = (logs / f"{name}.log").read_text().splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        service = name.split("-")[0]
        assert events and all(e.get("service") == service for e in events[:3]), name
        assert any(e.get("level") == "debug" for e in events), name  # --log-level reached it
        served[name] = sum(e.get("event") == "request_done" for e in events)
    assert served["tokenizer-0"] >= 1 and served["tokenizer-1"] >= 1, served
    assert served["tokenizer-0"] + served["tokenizer-1"] >= 26, served  # smoke: +1 or +2
