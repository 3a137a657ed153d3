"""The one report writer of the benchmarks: every bench's result is one JSON document, written
whole (a temporary file renamed over the target, so a reader never sees half of one) with
`write_json`; the CPU benches also print it on stdout (`emit_report`). The GPU parts' documents
(gpu/common.new_doc) and their markdown tables (gpu/merge.py) build on these files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(doc: dict[str, Any], path: Path) -> None:
    """Write `doc` to `path` (parents made), indented, values JSON cannot hold as strings."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def emit_report(report: dict[str, Any], out: str = "") -> int:
    """Print a bench's JSON report on stdout (and write it to `out` if given); the command's
    exit code."""
    print(json.dumps(report, indent=2))
    if out:
        write_json(report, Path(out))
    return 0
