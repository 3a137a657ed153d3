"""The house figures of issue 25, as JSON: modules over 400 lines, functions over 80 lines,
`duplicates` pairs in production code, the modules that write a request's KV fields, and
(with --time-tests) the unit suite's wall time, whole and the quick pure part.

    python3 scripts/house_figures.py [--root DIR] [--time-tests] [--list]

Production code is every Python file git knows below the root (tracked, or untracked and not
ignored) outside tests/, less the generated protobuf stubs (radixmesh_wire/pb/). `--root` lets
the figures of an older commit be taken from a worktree (`git worktree add /tmp/before REV`).
The `duplicates` figure needs the `duplicates` command on PATH (null without it)."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODULE_LINES = 400
FUNCTION_LINES = 80
GENERATED = ("radixmesh_wire/pb/",)
# A request's KV bookkeeping (scheduler_service/request.py); `node` and `phase` are common
# names, so only writes through a request-like name count (r, req, request, chunked, item),
# and `self.` writes only inside request.py (the request's own methods).
KV_FIELDS = ("kv_slots", "kv_len", "pending", "cached_len", "node", "phase", "jump")
REQUEST_NAMES = re.compile(r"^(r|req|request|chunked|item)$")
QUICK = [
    "-m",
    "pytest",
    "-q",
    "-p",
    "no:cacheprovider",
    "tests/unit",
    "-m",
    "not integration and not slow",
]


def python_files(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "*.py"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted(p for p in out if (root / p).is_file())


def is_production(path: str) -> bool:
    return not path.startswith("tests/") and not path.startswith(GENERATED)


def long_functions(tree: ast.AST, path: str) -> list[tuple[str, int]]:
    """(path:line name, length) of each function or method over FUNCTION_LINES lines (nested
    functions count on their own too); the length runs from `def` to the last line."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > FUNCTION_LINES:
                out.append((f"{path}:{node.lineno} {node.name}", n))
    return out


def kv_writes(tree: ast.AST, own: bool) -> set[str]:
    """The KV fields this module assigns through a request-like name (r.kv_len = ...);
    `own`: the request's module, where `self.kv_len = ...` counts too."""
    found = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        flat: list[ast.expr] = []
        for t in targets:
            flat += list(t.elts) if isinstance(t, ast.Tuple) else [t]
        for t in flat:
            if (
                isinstance(t, ast.Attribute)
                and t.attr in KV_FIELDS
                and isinstance(t.value, ast.Name)
                and (REQUEST_NAMES.match(t.value.id) or (own and t.value.id == "self"))
            ):
                found.add(t.attr)
    return found


def duplicate_pairs(root: Path) -> dict[str, Any] | None:
    """Pairs `duplicates` lists with both sides in production code."""
    if shutil.which("duplicates") is None:
        return None
    out = subprocess.run(
        ["duplicates", "--repo", str(root), "--most", "200", "--seconds", "300"],
        capture_output=True,
        text=True,
    ).stdout
    rows = re.findall(r"^D\d+ (\S+?):\d+-\d+ ~ (\S+?):\d+-\d+", out, re.M)
    prod = [(a, b) for a, b in rows if is_production(a) and is_production(b)]
    more = re.search(r"\(\+(\d+) more pairs\)", out)
    return {
        "production_pairs": len(prod),
        "all_pairs_listed": len(rows),
        "truncated": bool(more) or "incomplete:" in out,
        "pairs": [f"{a} ~ {b}" for a, b in prod],
    }


def time_tests(root: Path) -> dict[str, Any]:
    """Wall seconds of the unit suite and of its quick part (run one after the other), with the
    CPU seconds (user + system) they used: on a shared machine wall time follows the load, CPU
    time much less. Also the last line pytest printed (passed, failed, deselected)."""
    figures: dict[str, Any] = {}
    for name, argv in (
        ("unit_suite", QUICK[:6]),
        ("unit_quick", QUICK),
    ):
        cpu0 = _children_cpu_s()
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, *argv], cwd=root, capture_output=True, text=True)
        figures[f"{name}_wall_s"] = round(time.monotonic() - t0, 1)
        figures[f"{name}_cpu_s"] = round(_children_cpu_s() - cpu0, 1)
        figures[f"{name}_result"] = (out.stdout.strip().splitlines() or [""])[-1]
    figures["load_average_1m_at_end"] = os.getloadavg()[0]
    return figures


def _children_cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def figures(root: Path, with_tests: bool) -> dict[str, Any]:
    big_modules: list[tuple[str, int]] = []
    long_funcs: list[tuple[str, int]] = []
    writers: dict[str, list[str]] = {f: [] for f in KV_FIELDS}
    lines = 0
    for path in python_files(root):
        if not is_production(path):
            continue
        text = (root / path).read_text(encoding="utf-8", errors="replace")
        n = text.count("\n")
        lines += n
        if n > MODULE_LINES:
            big_modules.append((path, n))
        tree = ast.parse(text, filename=path)
        long_funcs += long_functions(tree, path)
        if path.startswith("scheduler_service/"):
            for f in kv_writes(tree, own=path == "scheduler_service/request.py"):
                writers[f].append(path)
    out: dict[str, Any] = {
        "root": str(root),
        "production_lines": lines,
        "modules_over_400_lines": len(big_modules),
        "functions_over_80_lines": len(long_funcs),
        "request_kv_field_writers": {f: len(ms) for f, ms in writers.items()},
        "duplicates": duplicate_pairs(root),
        "modules": dict(sorted(big_modules, key=lambda x: -x[1])),
        "functions": dict(sorted(long_funcs, key=lambda x: -x[1])),
        "kv_writer_modules": writers,
    }
    if with_tests:
        out.update(time_tests(root))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--time-tests", action="store_true", help="also time the unit suite")
    ap.add_argument("--list", action="store_true", help="name the modules, functions, pairs")
    args = ap.parse_args(argv)
    out = figures(args.root.resolve(), args.time_tests)
    if not args.list:
        for key in ("modules", "functions", "kv_writer_modules"):
            out.pop(key)
        if out["duplicates"]:
            out["duplicates"].pop("pairs")
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
