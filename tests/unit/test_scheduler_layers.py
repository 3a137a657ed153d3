"""Folder rules inside the services (issue 25): the sub-packages name the parts, and what each
part may import is a rule on its folder, checked from the source (AST) and, for the wire-free
parts, in a fresh interpreter so a module another test imported does not hide an import.

Scheduler (`scheduler_service/`):
- `cache/` (prefix cache protocol, radix tree, table and no-cache ablations, slot allocator,
  integrity checks, publisher) is the core algorithm: it imports nothing else of the scheduler
  and neither torch, grpc nor protobuf;
- `planner/`, `grammar/` and `sessions/` plan and bookkeep with plain dataclasses: they never
  import `links/`, grpc or protobuf;
- only `links/` (model, grammar, front-door streams) and `__main__` speak gRPC and protobuf.

Front door (`tokenizer_service/`):
- `routing/` (router, replica set/view, traffic share, scheduler link) never imports `http/`,
  and its router, replica view and traffic share are pure policy (no I/O, no protobuf);
- only `http/` imports aiohttp.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import scheduler_service
import tokenizer_service
from tests.unit.test_import_graph import gc_held, parse_quietly

SCHED = Path(scheduler_service.__file__).parent
FRONT = Path(tokenizer_service.__file__).parent
WIRE = ("grpc", "google.protobuf", "radixmesh_wire.pb")
WIRE_FREE = ("cache", "planner", "grammar", "sessions")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(parse_quietly(path)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _folder_imports(folder: Path) -> dict[str, set[str]]:
    with gc_held():
        return {str(p.relative_to(folder.parent)): _imports(p) for p in folder.rglob("*.py")}


def _violations(folder: Path, banned: tuple[str, ...]) -> dict[str, list[str]]:
    out = {
        f: sorted(n for n in names if n.startswith(banned))
        for f, names in _folder_imports(folder).items()
    }
    return {f: v for f, v in out.items() if v}


def test_the_scheduler_has_its_named_parts() -> None:
    parts = {p.name for p in SCHED.iterdir() if (p / "__init__.py").exists()}
    assert parts == {"cache", "planner", "grammar", "links", "sessions"}
    assert {p.name for p in FRONT.iterdir() if (p / "__init__.py").exists()} == {
        "routing",
        "http",
    }


def test_cache_imports_nothing_else_of_the_scheduler_nor_torch_or_the_wire() -> None:
    others = tuple(
        f"scheduler_service.{p}" for p in ("planner", "grammar", "links", "sessions", "scheduler")
    )
    bad = _violations(SCHED / "cache", (*others, "torch", *WIRE))
    assert bad == {}


def test_only_links_and_main_speak_the_wire() -> None:
    offenders: dict[str, list[str]] = {}
    for part in WIRE_FREE:
        offenders |= _violations(SCHED / part, (*WIRE, "scheduler_service.links"))
    with gc_held():
        for p in SCHED.glob("*.py"):
            if p.stem == "__main__":
                continue
            bad = sorted(n for n in _imports(p) if n.startswith(WIRE))
            if bad:
                offenders[p.name] = bad
    assert offenders == {}


@pytest.mark.integration  # starts a process
def test_wire_free_parts_load_no_protobuf_or_grpc() -> None:
    mods = [
        "scheduler_service." + ".".join(p.relative_to(SCHED).with_suffix("").parts)
        for part in WIRE_FREE
        for p in sorted((SCHED / part).glob("*.py"))
        if p.stem != "__init__"
    ]
    assert len(mods) > 15
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in mods)
        + f"print(sorted(m for m in sys.modules if m.startswith({WIRE!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"


def test_front_door_routing_is_below_http_and_only_http_imports_aiohttp() -> None:
    assert _violations(FRONT / "routing", ("tokenizer_service.http", "aiohttp")) == {}
    pure = {"router.py", "replica_view.py", "traffic_share.py"}
    impure = {
        f: sorted(n for n in names if n.startswith((*WIRE, "asyncio", "aiohttp")))
        for f, names in _folder_imports(FRONT / "routing").items()
        if Path(f).name in pure
    }
    assert {f: v for f, v in impure.items() if v} == {}
    outside_http = {
        f: v
        for f, v in _violations(FRONT, ("aiohttp",)).items()
        if not f.startswith("tokenizer_service/http/")
    }
    assert outside_http == {}
