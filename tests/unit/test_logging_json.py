"""JSON logs are JSON only: structlog events, stdlib records (gRPC's Python layer, asyncio),
warnings, uncaught exceptions and raw writes to file descriptor 2 (gRPC's C core, stray prints)
all leave as one JSON object per line, tracebacks as one field, each with the service name."""

from __future__ import annotations

import json
import subprocess
import sys

PROGRAM = r"""
import logging, os, sys, threading, warnings
import structlog
from services.logging import configure_logging
configure_logging("scheduler", "debug", json=True)
structlog.contextvars.bind_contextvars(rid="abc")
structlog.get_logger().info("submitted", prompt_tokens=3)
logging.getLogger("grpc._cython.cygrpc").warning("stdlib line\nwith a second line")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("asyncio").exception("task failed")
os.write(2, b"E1127 06:00:00.123456  12 chttp2_transport.cc:1234] raw gRPC core line\n")
print("a stray print\nover two lines", file=sys.stderr)
warnings.warn("careful")
t = threading.Thread(target=lambda: 1 / 0)
t.start()
t.join()
os.write(2, b"the last raw line before exit\n")
raise RuntimeError("boom at the end")
"""


def test_every_stderr_line_of_a_json_service_is_one_json_event() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1
    lines = out.stderr.splitlines()
    events = [json.loads(line) for line in lines]  # every line parses
    assert all(isinstance(e, dict) and e["service"] == "scheduler" for e in events), lines
    by_event = {e["event"]: e for e in events}
    assert by_event["submitted"]["rid"] == "abc"
    stdlib = by_event["stdlib line\nwith a second line"]
    assert stdlib["logger"] == "grpc._cython.cygrpc" and stdlib["rid"] == "abc"
    failed = by_event["task failed"]
    assert "ZeroDivisionError" in failed["exception"] and failed["level"] == "error"
    raw = [e for e in events if e["event"] == "stderr"]
    messages = [e["message"] for e in raw]
    assert any("raw gRPC core line" in m for m in messages)
    assert next(e for e in raw if "raw gRPC core" in e["message"])["level"] == "error"
    assert "a stray print" in messages and "over two lines" in messages
    assert "the last raw line before exit" in messages  # drained at exit, not lost
    assert any("careful" in e["event"] for e in events if e.get("logger") == "py.warnings")
    thread = by_event["uncaught_thread_exception"]
    assert "ZeroDivisionError" in thread["exception"]
    final = by_event["uncaught_exception"]
    assert final["level"] == "critical" and "boom at the end" in final["exception"]


def test_text_mode_keeps_key_value_lines_for_stdlib_records() -> None:
    code = (
        "import logging\n"
        "from services.logging import configure_logging\n"
        "configure_logging('model', 'info')\n"
        "logging.getLogger('grpc').warning('from grpc')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    line = out.stderr.strip().splitlines()[-1]
    assert "level='warning'" in line and "service='model'" in line
    assert "event='from grpc'" in line and "logger='grpc'" in line
