"""The project's package-level import graph (issue 11): services import no other service, the
wire package imports no other project package, the server layer does not import the benchmarks,
no cycles among the top-level packages; and, in real processes, no service loads the DSL and
`radixmesh --help` loads neither torch nor xgrammar.

The graph is read from the source (AST, every `import` anywhere in a module, lazy ones and
TYPE_CHECKING ones included), so a test fails on the edge itself, not on a symptom of it.
"""

from __future__ import annotations

import ast
import gc
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Top-level package -> its folder.
PACKAGES: dict[str, Path] = {
    "radixmesh": ROOT / "client" / "radixmesh",
    "radixmesh_wire": ROOT / "radixmesh_wire",
    "services": ROOT / "services",
    "radixmesh_bench": ROOT / "radixmesh_bench",
    "tokenizer_service": ROOT / "tokenizer_service",
    "scheduler_service": ROOT / "scheduler_service",
    "model_service": ROOT / "model_service",
    "grammar_service": ROOT / "grammar_service",
    "tests": ROOT / "tests",
}
SERVICES = ("tokenizer_service", "scheduler_service", "model_service", "grammar_service")

Edges = dict[str, dict[str, list[str]]]  # package -> imported package -> importing files


def _imported_names(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


@contextmanager
def gc_held() -> Iterator[None]:
    """The garbage collector held off: on CPython 3.11 a finalizer that runs while an AST is
    built (an event loop or gRPC object an earlier test left behind) breaks the parser's
    recursion bookkeeping ("AST constructor recursion depth mismatch"). One collection first,
    for all the files parsed inside (a collection per file cost minutes on a full heap)."""
    if not gc.isenabled():
        yield
        return
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def parse_quietly(path: Path) -> ast.Module:
    with gc_held():
        return ast.parse(path.read_text(), filename=str(path))


def import_graph() -> Edges:
    edges: Edges = {name: {} for name in PACKAGES}
    with gc_held():
        for pkg, folder in PACKAGES.items():
            for path in sorted(folder.rglob("*.py")):
                tree = parse_quietly(path)
                for name in _imported_names(tree):
                    top = name.split(".")[0]
                    if top in PACKAGES and top != pkg:
                        files = edges[pkg].setdefault(top, [])
                        rel = str(path.relative_to(ROOT))
                        if rel not in files:
                            files.append(rel)
    return edges


def render(edges: Edges) -> str:
    lines = []
    for pkg in PACKAGES:
        targets = sorted(t for t in edges[pkg])
        lines.append(f"{pkg} -> {', '.join(targets) if targets else '(none)'}")
    return "\n".join(lines)


def find_cycle(edges: Edges, nodes: list[str]) -> list[str] | None:
    """A cycle among `nodes` (by DFS), as the path that closes it, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges[n]):
            if m not in nodes:
                continue
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in nodes:
        if n not in state and (found := visit(n)):
            return found
    return None


@pytest.fixture(scope="module")
def graph() -> Edges:
    return import_graph()


def _offending(graph: Edges, pkg: str, banned: tuple[str, ...]) -> dict[str, list[str]]:
    return {t: files for t, files in graph[pkg].items() if t in banned}


def test_no_service_imports_another(graph: Edges) -> None:
    for svc in SERVICES:
        bad = _offending(graph, svc, tuple(s for s in SERVICES if s != svc))
        assert not bad, f"{svc} imports another service: {bad}\n{render(graph)}"


def test_server_layer_does_not_import_bench_or_services(graph: Edges) -> None:
    bad = _offending(graph, "services", ("radixmesh_bench", *SERVICES))
    assert not bad, f"services imports {bad}\n{render(graph)}"


def test_services_do_not_import_bench_or_dsl(graph: Edges) -> None:
    for svc in SERVICES:
        bad = _offending(graph, svc, ("radixmesh_bench", "radixmesh", "tests"))
        assert not bad, f"{svc} imports {bad}\n{render(graph)}"


def test_wire_imports_no_project_package(graph: Edges) -> None:
    assert not graph["radixmesh_wire"], (
        f"radixmesh_wire imports {graph['radixmesh_wire']}\n{render(graph)}"
    )


def test_client_imports_only_the_wire(graph: Edges) -> None:
    bad = {t: f for t, f in graph["radixmesh"].items() if t != "radixmesh_wire"}
    assert not bad, f"the client imports {bad}\n{render(graph)}"


def test_no_cycles_among_packages(graph: Edges) -> None:
    nodes = [p for p in PACKAGES if p != "tests"]
    cycle = find_cycle(graph, nodes)
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}\n{render(graph)}"


def test_find_cycle_finds_one() -> None:
    """The checker itself can fail: a planted two-package cycle is found."""
    planted: Edges = {"a": {"b": ["x"]}, "b": {"c": ["y"]}, "c": {"a": ["z"]}, "d": {}}
    assert find_cycle(planted, ["a", "b", "c", "d"]) == ["a", "b", "c", "a"]
    del planted["c"]["a"]
    assert find_cycle(planted, ["a", "b", "c", "d"]) is None


# In a real interpreter: import each service's entry module and every module of the service
# (model_service imports its engine lazily, inside main), then list what got loaded.
_SERVICE_PROBE = """
import importlib, json, pkgutil, sys
pkg = importlib.import_module({pkg!r})
importlib.import_module({pkg!r} + ".__main__")
skipped = []
for info in pkgutil.walk_packages(pkg.__path__, {pkg!r} + "."):
    try:
        importlib.import_module(info.name)
    except ImportError as exc:  # optional GPU dependencies (flashinfer) on this machine
        if (exc.name or "").split(".")[0] == {pkg!r}.split(".")[0]:
            raise
        skipped.append(info.name)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {projects!r})
print(json.dumps({{"loaded": loaded, "skipped": skipped}}))
"""


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(ROOT / "client"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.integration  # starts a process
@pytest.mark.parametrize("svc", SERVICES)
def test_service_process_loads_no_dsl(svc: str) -> None:
    code = _SERVICE_PROBE.format(pkg=svc, projects=tuple(PACKAGES))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    loaded = report["loaded"]
    assert f"{svc}.__main__" in loaded
    dsl = [m for m in loaded if m == "radixmesh" or m.startswith("radixmesh.")]
    bench = [m for m in loaded if m.startswith("radixmesh_bench")]
    others = [m for m in loaded if m.split(".")[0] in SERVICES and m.split(".")[0] != svc]
    assert not dsl and not bench and not others, (dsl, bench, others)


_CLI_PROBE = """
import atexit, json, sys
atexit.register(lambda: print("LOADED=" + json.dumps(sorted(sys.modules))))
from services.cli import main
sys.exit(main({argv!r}))
"""


@pytest.mark.integration  # starts a process
@pytest.mark.parametrize(
    "argv", [["--help"], ["generate", "--help"], ["serve", "--help"], ["certs", "--help"]]
)
def test_cli_help_loads_no_heavy_module(argv: list[str]) -> None:
    code = _CLI_PROBE.format(argv=argv)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "usage: radixmesh" in out.stdout
    line = next(x for x in out.stdout.splitlines() if x.startswith("LOADED="))
    loaded = set(json.loads(line.removeprefix("LOADED=")))
    heavy = {"torch", "xgrammar", "transformers", "radixmesh_bench", "radixmesh.lang"}
    assert not heavy & loaded, sorted(heavy & loaded)
