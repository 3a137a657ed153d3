"""The scheduler's planner is protobuf-free: its modules, and everything they import, load
neither grpc nor protobuf; only the link modules (and `__main__`) name them. Checked in a fresh
interpreter, so modules other tests imported do not hide an import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import scheduler_service
from tests.unit.test_import_graph import gc_held, parse_quietly

PLANNER = (
    "batch_builder",
    "output_processor",
    "step_masks",
    "grammar_ops",
    "grammar_pool",
    "grammar_placement",
    "constrained_rows",
    "retraction",
    "state",
    "status",
)
LINKS = {"model_link", "grammar_link", "frontend_link", "__main__"}
WIRE = ("grpc", "google.protobuf", "radixmesh_wire.pb")


def test_planner_modules_load_no_protobuf_or_grpc() -> None:
    code = (
        "import sys\n"
        + "".join(f"import scheduler_service.{m}\n" for m in PLANNER)
        + f"print(sorted(m for m in sys.modules if m.startswith({WIRE!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(parse_quietly(path)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_link_modules_import_grpc_or_protobuf() -> None:
    folder = Path(scheduler_service.__file__).parent
    with gc_held():
        offenders = {
            p.stem: sorted(n for n in _imports(p) if n.startswith(WIRE))
            for p in folder.glob("*.py")
            if p.stem not in LINKS
        }
    assert {k: v for k, v in offenders.items() if v} == {}
