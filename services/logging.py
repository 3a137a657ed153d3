"""structlog setup shared by every service: one event per line on stderr, every line through
structlog's renderer (key-value text, or JSON with `json=True`).

What reaches stderr, and how it becomes one rendered line:
- structlog events: rendered directly (the hot path: no stdlib handler in between).
- stdlib `logging` records (grpc's Python layer, asyncio, aiohttp, libraries): a root handler
  with structlog's `ProcessorFormatter`, so they carry `service`, the request id bound in the
  context, and a traceback as one `exception` field instead of many lines.
- `warnings`: captured into logging (`py.warnings`).
- An uncaught exception (main thread or any other): logged as one event with its traceback.
- In JSON mode, anything else written to file descriptor 2 (gRPC's C core and absl print
  there directly, as do faulthandler and stray prints): fd 2 becomes a pipe read by a thread
  that passes JSON lines through and wraps every other line as an event (`event: "stderr"`,
  the text in `message`, the level from absl's `E1127 ...` prefix when it has one). At exit
  the pipe is closed and drained, so a last line before exit is not lost.
"""

from __future__ import annotations

import atexit
import contextlib
import json as jsonlib
import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

import structlog

_ABSL_LEVELS = {"E": "error", "W": "warning", "I": "info", "F": "critical", "D": "debug"}


def configure_logging(service: str, level: str = "info", json: bool = False) -> None:
    """Route structlog, stdlib logging, warnings, uncaught exceptions and (JSON mode) raw
    stderr through one renderer, with the service name bound to every event."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    out: TextIO = _capture_stderr(service) if json else sys.stderr
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.processors.KeyValueRenderer(
            key_order=["timestamp", "level", "service", "event"], drop_missing=True
        )
    )

    def add_service(_: Any, __: str, event: structlog.typing.EventDict) -> Any:
        event.setdefault("service", service)  # threads without the bound context too
        return event

    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_service,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(lvl)
    logging.captureWarnings(True)
    structlog.contextvars.bind_contextvars(service=service)
    _log_uncaught()


def _log_uncaught() -> None:
    """Uncaught exceptions become one event with the traceback as a field."""
    log = structlog.get_logger("uncaught")

    def main_hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, exc, tb)
            return
        log.critical("uncaught_exception", exc_info=(kind, exc, tb))

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is None:
            return
        name = args.thread.name if args.thread is not None else "?"
        exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
        log.error("uncaught_thread_exception", thread=name, exc_info=exc_info)

    sys.excepthook = main_hook
    threading.excepthook = thread_hook


_captured: dict[str, Any] = {}


def _capture_stderr(service: str) -> TextIO:
    """Make fd 2 a pipe whose lines are re-emitted as JSON on the real stderr; returns the
    real stderr (a line-buffered file) for structlog and the logging handler to write to."""
    if "out" in _captured:  # configured twice in one process: keep the first pipe
        _captured["service"] = service
        out: TextIO = _captured["out"]
        return out
    sys.stderr.flush()
    real = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    out = os.fdopen(real, "w", buffering=1, encoding="utf-8", errors="replace")
    lock = threading.Lock()
    _captured.update(out=out, service=service, lock=lock)

    def pump() -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line.strip():
                    rendered = _as_json_line(line, _captured["service"])
                    with lock:
                        out.write(rendered + "\n")
                        out.flush()

    thread = threading.Thread(target=pump, name="stderr-to-json", daemon=True)
    thread.start()

    def drain() -> None:
        """At exit: close the pipe's write end (fd 2 goes back to the real stderr), then let
        the pump finish the lines still in the pipe."""
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(real, 2)
        thread.join(timeout=1.0)  # a child process may still hold the pipe open

    atexit.register(drain)
    return out


def _as_json_line(line: str, service: str) -> str:
    """A line written to fd 2: JSON objects pass as they are, anything else is wrapped."""
    if line.startswith("{"):
        try:
            if isinstance(jsonlib.loads(line), dict):
                return line
        except ValueError:
            pass
    level = "warning"
    if len(line) > 5 and line[0] in _ABSL_LEVELS and line[1:5].isdigit():
        level = _ABSL_LEVELS[line[0]]  # absl / gRPC core: "E1127 06:00:00.123 ... msg"
    event = {
        "event": "stderr",
        "message": line,
        "level": level,
        "service": service,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z",
    }
    return jsonlib.dumps(event)
