"""The last lines of a service's log, for the launcher's stderr when the service dies: start-up
errors must show their reason without the user hunting for a log file."""

from __future__ import annotations

import os
from pathlib import Path

TAIL_LINES = 20
_TAIL_BYTES = 64 * 1024  # enough for TAIL_LINES lines of structlog output


def read_tail(path: Path, start: int = 0, lines: int = TAIL_LINES) -> list[str]:
    """The last `lines` lines of `path` written after byte offset `start` (where this run of
    the service began appending); [] if the file is missing."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            f.seek(max(start, size - _TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace")
    return [line for line in text.splitlines() if line.strip()][-lines:]


def death_report(name: str, code: int | None, log: Path, start: int, when: str) -> str:
    """A block for stderr: what died, its last lines, where the whole log is."""
    tail = read_tail(log, start)
    head = f"radixmesh: service {name} exited with code {code} {when}"
    body = "\n".join(f"  | {line}" for line in tail) if tail else "  | (no output)"
    return f"{head}; its last {len(tail)} lines:\n{body}\n  full log: {log}"


def log_size(path: Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
