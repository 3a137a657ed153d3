"""Service logs: the folder they live in (private to the operator), and the last lines of a
log for the launcher's stderr when the service dies: start-up errors must show their reason
without the user hunting for a log file."""

from __future__ import annotations

import os
import stat
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


class LogDirError(ValueError):
    """A log folder that cannot be made private; the message says what to pass instead."""


def make_private_dir(path: Path) -> bool:
    """Make `path` a 0700 folder (logs are the operator's alone: they hold prompts' ids,
    tenants and errors). An existing folder of ours is tightened to 0700, not trusted as it
    is; a shared one (sticky, like /tmp) or someone else's is refused rather than changed.
    Returns True when an existing folder's mode was tightened."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o077:
        return False
    if st.st_uid != os.getuid() or mode & stat.S_ISVTX:
        raise LogDirError(
            f"log folder {path} is shared (mode {mode:o}, owner uid {st.st_uid}): pass "
            "--log-dir a folder of your own (created 0700 if missing)"
        )
    os.chmod(path, 0o700)
    return True
