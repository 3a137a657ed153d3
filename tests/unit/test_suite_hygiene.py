"""The suite itself (issue 30): no test can fail because the machine is slow (no wall-clock
assertion, no sleep as synchronisation: tests/wallclock_audit.py), and every child process a
test starts runs the suite's own interpreter (scripts/test.sh runs it from the clone's virtual
environment, where a bare `python3` may be another Python without the project)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.wallclock_audit import ROOT, audit, audit_source

BEFORE_ISSUE_30 = """
import statistics, time

def _healthy(c):
    t0 = time.perf_counter()
    c.generate("x")
    return time.perf_counter() - t0

def test_fuzz(c):
    idle = statistics.median(_healthy(c) for _ in range(3))
    seen = []
    seen.append(_healthy(c))
    assert seen and max(seen) <= 3 * idle, (idle, seen)

def test_timed(c):
    t0 = time.monotonic()
    c.generate("x")
    assert time.monotonic() - t0 < 5.0

def _timed(c):
    t0 = time.monotonic()
    return c.generate("x"), time.monotonic() - t0

def test_pair(c):
    res, latency = _timed(c)
    assert res.ok
    assert latency < 3

def test_guard(c):
    t0 = time.monotonic()
    if time.monotonic() - t0 > 2:
        pytest.fail("slow")

async def test_sync(c):
    c.start()
    time.sleep(0.2)
    await asyncio.sleep(0.1)
"""

ALLOWED = """
import time

def test_poll(c):
    deadline = time.monotonic() + 60
    while not c.ready():
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.05)

def test_figure(c):
    t0 = time.monotonic()
    took = time.monotonic() - t0
    print(f"{took:.2f} s")
    seen = [took]
    assert seen

def test_simulated_time(dog):
    assert dog.problem(time.monotonic() + 1.0) is None

def test_lower_bound(c):
    t0 = time.monotonic()
    ended = time.monotonic() - t0
    assert ended > 1.5  # lower bound: load only adds time

async def test_stand_in():
    await asyncio.sleep(3600)  # stand-in: a peer that never answers
    await asyncio.sleep(0)
"""


def test_the_suite_has_no_wall_clock_assertion_and_no_sleep_as_synchronisation() -> None:
    findings = audit()
    assert findings == [], "\n".join(map(str, findings))


def test_the_audit_finds_the_patterns_it_forbids() -> None:
    found = [(f.line, f.kind) for f in audit_source(BEFORE_ISSUE_30, "before.py")]
    lines = BEFORE_ISSUE_30.splitlines()
    where = {lines[n - 1].strip().split(" ")[0] + f"@{n}": kind for n, kind in found}
    assert sorted(found) == [
        (13, "wall-clock assertion"),  # the fuzz test's 3x idle latency (test_fuzz.py:187)
        (18, "wall-clock assertion"),
        (27, "wall-clock assertion"),  # through a helper's returned tuple
        (31, "wall-clock assertion"),  # an `if ...: pytest.fail` guard
        (36, "sleep as synchronisation"),
        (37, "sleep as synchronisation"),
    ], where
    assert audit_source(ALLOWED, "allowed.py") == []


def _argv0_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """`subprocess.run(["python3", ...])` and the like: a child started by name, not by
    sys.executable."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name not in {"run", "Popen", "call", "check_call", "check_output"}:
            continue
        first = node.args[0]
        if isinstance(first, ast.List) and first.elts:
            first = first.elts[0]
        if isinstance(first, ast.Constant) and str(first.value).split()[0:1] in (
            ["python"],
            ["python3"],
            ["pytest"],
            ["radixmesh"],
        ):
            out.append((node.lineno, str(first.value)))
    return out


def test_child_processes_run_the_suites_own_python() -> None:
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for line, argv0 in _argv0_literals(ast.parse(path.read_text())):
            bad.append(f"{path.relative_to(ROOT)}:{line}: {argv0!r} (use sys.executable)")
    assert bad == [], "\n".join(bad)
    assert _argv0_literals(ast.parse('subprocess.run(["python3", "-m", "x"])')) == [(1, "python3")]


def test_scripts_run_the_environment_they_installed() -> None:
    """serve.sh and test.sh run the clone's virtual environment's programs, never a bare
    `python3`/`radixmesh` from whatever PATH holds."""
    serve = (ROOT / "scripts" / "serve.sh").read_text()
    test = (ROOT / "scripts" / "test.sh").read_text()
    assert 'exec "$VENV/bin/radixmesh" serve "$@"' in serve
    assert 'source "$VENV/bin/activate"' in test
    for text in (serve, test):
        code = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
        assert not [ln for ln in code if ln.lstrip().startswith(("python3 ", "radixmesh "))]
    assert Path(ROOT / "scripts" / "install.sh").read_text().count("editable_mode=compat") == 1
