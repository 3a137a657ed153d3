"""A static audit of the test suite for checks that a slow machine can fail (issue 30):

- a wall-clock assertion: an `assert` (or `pytest.fail`/`raise AssertionError` guard) whose
  expression depends on a clock reading (time.monotonic / perf_counter / time.time), directly
  or through a name or a helper's return value computed from one. Durations are figures to
  report, never to assert; count steps or events, or assert an ordering, instead.
- a sleep as synchronisation: `time.sleep`/`asyncio.sleep` outside a loop (a loop that sleeps
  between checks of a condition is a poll, which waits as long as the condition needs). A
  sleep that stands for work or a hang in a stand-in says so on its line with a comment
  holding "stand-in" or "not synchronisation".

A lower bound (`assert ended > GRACE - 1.5`: nothing was cut early) cannot fail on a slow
machine; such a line says "load only adds time" and is allowed.

Bounded polls (`deadline = time.monotonic() + 30` in a loop condition) are timeouts, not
assertions: a clock in a loop condition is allowed; the assertion after such a loop must be
on the condition, not on the clock.

tests/unit/test_suite_hygiene.py runs it over the suite; `python -m tests.wallclock_audit`
prints the findings.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"}
SLEEP_OK = ("stand-in", "not synchronisation")
# A lower bound on a duration ("not cut before the grace") cannot fail because the machine is
# slow: an assertion line saying so is allowed.
LOWER_BOUND = "load only adds time"
SLEEPERS = {"time", "asyncio"}
# Benchmark scripts report figures and are not collected by pytest.
AUDITED = ("unit", "integration", "deploy", "gpu")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    kind: str  # "wall-clock assertion" or "sleep as synchronisation"
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.text}"


def _is_clock(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute) and f.attr in CLOCKS:
        return isinstance(f.value, ast.Name) and f.value.id == "time"
    return isinstance(f, ast.Name) and f.id in {"monotonic", "perf_counter"}


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


# Calls whose result carries their arguments' durations; any other call is opaque (a clock
# value passed in as simulated time, `watchdog.problem(now + 1)`, is an input, not a bound).
TRANSPARENT = {"max", "min", "sum", "abs", "round", "float", "int", "sorted", "median", "mean"}
TRANSPARENT |= {"fmean", "quantiles", "append", "extend", "add"}


class _Scope:
    """Clock-derived names of one top-level function (or the module's own statements), given
    the module's functions that return clock-derived values (`funcs`: name -> which tuple
    positions, or None for a single value)."""

    def __init__(self, body: list[ast.stmt], funcs: dict[str, set[int] | None]) -> None:
        self.funcs = funcs
        self.names: set[str] = set()
        nodes = [n for stmt in body for n in ast.walk(stmt)]
        changed = True
        while changed:
            before = len(self.names)
            for node in nodes:
                self._visit(node)
            changed = len(self.names) != before

    def tainted(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            if _is_clock(node) or _call_name(node) in self.funcs:
                return True
            if _call_name(node) not in TRANSPARENT:
                return False
            return any(self.tainted(a) for a in node.args)
        if isinstance(node, ast.Name):
            return node.id in self.names
        return any(self.tainted(c) for c in ast.iter_child_nodes(node))

    def _visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign) and node.value:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            where = self.funcs.get(_call_name(value), None) if isinstance(value, ast.Call) else None
            for t in targets:
                if isinstance(t, ast.Tuple) and where is not None:
                    # a, b = f(): only the positions f returns durations in
                    for i, elt in enumerate(t.elts):
                        if i in where:
                            self.names |= _names(elt)
                elif self.tainted(value):
                    self.names |= _names(t)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            # seen.append(latency) makes `seen` a list of durations
            if node.func.attr in {"append", "extend", "add"} and any(
                self.tainted(a) for a in node.args
            ):
                self.names |= _names(node.func.value)
        elif isinstance(node, ast.For) and self.tainted(node.iter):
            self.names |= _names(node.target)


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out.append(node)
        elif isinstance(node, ast.ClassDef):
            out += [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return out


def _clock_functions(tree: ast.Module) -> dict[str, set[int] | None]:
    """Functions that return a clock-derived value (None) or a tuple with some (positions)."""
    funcs: dict[str, set[int] | None] = {}
    changed = True
    while changed:
        changed = False
        for fn in _functions(tree):
            if fn.name in funcs:
                continue
            scope = _Scope(fn.body, funcs)
            for r in ast.walk(fn):
                if not isinstance(r, ast.Return) or r.value is None:
                    continue
                if isinstance(r.value, ast.Tuple):
                    pos = {i for i, e in enumerate(r.value.elts) if scope.tainted(e)}
                    if pos:
                        funcs[fn.name], changed = pos, True
                elif scope.tainted(r.value):
                    funcs[fn.name], changed = None, True
    return funcs


def audit_source(source: str, path: str) -> list[Finding]:
    tree = ast.parse(source)
    lines = source.splitlines()
    funcs = _clock_functions(tree)
    out: list[Finding] = []
    top = [s for s in tree.body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)]
    for body in [top, *(fn.body for fn in _functions(tree))]:
        scope = _Scope(body, funcs)
        for stmt in body:
            for check in _checks(stmt, in_poll=False):
                text = lines[check.lineno - 1]
                if LOWER_BOUND in text:
                    continue
                if any(_compares(scope, n) for n in ast.walk(check.test)):
                    out.append(Finding(path, check.lineno, "wall-clock assertion", text))
    for sleep in _sleeps_outside_loops(tree):
        line = lines[sleep.lineno - 1]
        zero = [a for a in sleep.args if isinstance(a, ast.Constant) and a.value == 0]
        if not zero and not any(ok in line for ok in SLEEP_OK):
            out.append(Finding(path, sleep.lineno, "sleep as synchronisation", line))
    return out


def _compares(scope: _Scope, node: ast.AST) -> bool:
    """A comparison with a clock-derived side (`took < 5`); `assert seen` (not empty) or a
    clock passed into a call as simulated time is not one."""
    if not isinstance(node, ast.Compare):
        return False
    return any(scope.tainted(side) for side in [node.left, *node.comparators])


def _checks(node: ast.AST, in_poll: bool) -> Iterator[ast.Assert | ast.If]:
    """Asserts, and `if ...: pytest.fail(...)` guards, outside poll loops (a `while` loop's
    clock check is that poll's timeout: it bounds a wait for an event, it does not time it)."""
    if isinstance(node, ast.While):
        in_poll = True
    check = isinstance(node, ast.Assert) or (isinstance(node, ast.If) and _fails(node.body))
    if check and not in_poll:
        yield node  # type: ignore[misc]
    for child in ast.iter_child_nodes(node):
        yield from _checks(child, in_poll)


def _fails(body: list[ast.stmt]) -> bool:
    """Does this block fail the test (pytest.fail or raise AssertionError)?"""
    for stmt in body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Call) and _call_name(n) == "fail":
                return True
            if isinstance(n, ast.Raise) and n.exc is not None and "AssertionError" in _names(n.exc):
                return True
    return False


def _sleeps_outside_loops(tree: ast.AST) -> Iterator[ast.Call]:
    def walk(node: ast.AST, in_loop: bool) -> Iterator[ast.Call]:
        for child in ast.iter_child_nodes(node):
            loop = in_loop or isinstance(child, ast.For | ast.While | ast.AsyncFor)
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                loop = False  # a nested function's own body
            if isinstance(child, ast.Call) and _is_sleep(child) and not in_loop:
                yield child
            yield from walk(child, loop)

    yield from walk(tree, False)


def _is_sleep(node: ast.Call) -> bool:
    f = node.func
    return isinstance(f, ast.Attribute) and f.attr == "sleep" and bool(_names(f.value) & SLEEPERS)


def audit(root: Path = ROOT / "tests") -> list[Finding]:
    out: list[Finding] = []
    for sub in AUDITED:
        for path in sorted((root / sub).rglob("*.py")):
            rel = str(path.relative_to(root.parent))
            out += audit_source(path.read_text(), rel)
    return out


if __name__ == "__main__":
    found = audit()
    print("\n".join(map(str, found)) or "no findings")
    sys.exit(1 if found else 0)
