"""Tracing: runs a program once with abstract arguments and records a `ProgramGraph`.

The tracer state mimics `ProgramState`, but `+=` records nodes instead of executing them,
`s["x"]` returns a `Variable` placeholder and `fork` opens new streams. Anything that needs
a value at trace time (comparing a placeholder, reading `s.text()`, branching on a
generated value) raises `TracingError`: only programs without data-dependent control flow
can be compiled, as in the paper.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from radixmesh.lang.compiler import GraphNode, ProgramGraph
from radixmesh.lang.errors import TracingError
from radixmesh.lang.forks import BranchGroup
from radixmesh.lang.ir import (
    Argument,
    Expr,
    Fork,
    Gen,
    GetForkItem,
    GraphOp,
    Join,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    SubProgram,
    Variable,
    VarScopeBegin,
    VarScopeEnd,
    flatten,
)
from radixmesh.lang.state import join_mode


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[GraphNode] = []
        self.num_streams = 1
        self.parent: dict[int, int] = {}
        self.sources: dict[tuple[int, str], int] = {}  # (stream, var) -> producing node

    def add(self, stream: int, op: GraphOp) -> int:
        node_id = len(self.nodes)
        self.nodes.append(GraphNode(node_id, stream, op))
        return node_id

    def new_stream(self, parent: int | None) -> int:
        """A fork's stream (reads its parent's variables) or, with no parent, a called
        program's."""
        stream = self.num_streams
        self.num_streams += 1
        if parent is not None:
            self.parent[stream] = parent
        return stream

    def source(self, stream: int, name: str) -> int:
        """The node producing `name` as seen from `stream` (forks see their ancestors')."""
        s: int | None = stream
        while s is not None:
            if (s, name) in self.sources:
                return self.sources[(s, name)]
            s = self.parent.get(s)
        raise TracingError(f"variable {name!r} is read before any gen/select produces it")


class TracerState:
    """Stand-in for `ProgramState` while tracing (see module docstring)."""

    def __init__(self, builder: _Builder, stream: int) -> None:
        self._builder = builder
        self.stream = stream

    def __iadd__(self, other: Expr | str) -> TracerState:
        self.extend(other)
        return self

    def extend(self, other: Expr | str) -> None:
        for leaf in flatten(other):
            node_id = self._builder.add(self.stream, leaf)
            if isinstance(leaf, Gen | Select) and leaf.name is not None:
                self._builder.sources[(self.stream, leaf.name)] = node_id
            elif isinstance(leaf, SeparateReasoning):  # rewrites the gen's variable too
                self._builder.sources[(self.stream, leaf.gen_name)] = node_id
                self._builder.sources[(self.stream, leaf.name)] = node_id

    def __getitem__(self, name: str) -> Variable:
        return Variable(name, self.stream, self._builder.source(self.stream, name))

    def get_var(self, name: str) -> Variable:
        return self[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self._needs_value("s[name] = value")

    @contextmanager
    def _role_scope(self, role: str) -> Iterator[TracerState]:
        self.extend(RoleBegin(role))
        yield self
        self.extend(RoleEnd(role))

    def _role(self, role: str, expr: Expr | str | None) -> Any:
        if expr is None:
            return self._role_scope(role)
        self.extend(RoleBegin(role) + expr + RoleEnd(role))
        return None

    def system(self, expr: Expr | str | None = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Expr | str | None = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Expr | str | None = None) -> Any:
        return self._role("assistant", expr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[TracerState]:
        self.extend(VarScopeBegin(name))
        yield self
        node_id = self._builder.add(self.stream, VarScopeEnd(name))
        self._builder.sources[(self.stream, name)] = node_id

    def fork(
        self, size: int = 1, position_ids_offset: Sequence[int] | None = None
    ) -> TracerForkGroup:
        # position_ids_offset: accepted and ignored, as in SGLang (see ProgramState.fork)
        size = int(size)
        if size < 1:
            raise ValueError("fork needs size >= 1")
        streams = tuple(self._builder.new_stream(self.stream) for _ in range(size))
        fork_id = self._builder.add(self.stream, Fork(streams))
        for i, stream in enumerate(streams):
            self._builder.add(stream, GetForkItem(fork_id, i))
        return TracerForkGroup(self, fork_id, [TracerState(self._builder, s) for s in streams])

    def _needs_value(self, what: str) -> NoReturn:
        raise TracingError(f"{what} needs run-time values; it cannot be traced")

    def text(self) -> str:
        self._needs_value("s.text()")

    def messages(self) -> list[dict[str, str]]:
        self._needs_value("s.messages()")

    def sync(self) -> None:
        return None


class TracerForkGroup(BranchGroup[TracerState]):
    """A traced fork's branches (`forks.BranchGroup`); `join` records a Join node."""

    def __init__(self, parent: TracerState, fork_id: int, states: list[TracerState]) -> None:
        super().__init__(states)
        self._parent = parent
        self._fork_id = fork_id

    def join(self, mode: str = "gather_variable") -> None:
        mode = join_mode(mode)
        builder, parent = self._parent._builder, self._parent.stream
        join_id = builder.add(parent, Join(self._fork_id, mode))
        if mode == "gather":  # the branches' variables become lists in the parent
            branches = {s.stream for s in self._states}
            for stream, name in list(builder.sources):
                if stream in branches:
                    builder.sources[(parent, name)] = join_id


# The graph being traced on this thread, so that a program called from inside another one
# without a state (`expand(tip=s["tip"])`) is traced into it instead of being run.
_active = threading.local()


def active_builder() -> _Builder | None:
    builder: _Builder | None = getattr(_active, "builder", None)
    return builder


@contextmanager
def _tracing(builder: _Builder) -> Iterator[None]:
    outer = active_builder()
    _active.builder = builder
    try:
        yield
    finally:
        _active.builder = outer


def trace_call(
    func: Callable[..., Any], name: str, params: Sequence[str], arguments: Mapping[str, Any]
) -> TracerState:
    """Traces a call of program `name` made while another program is traced: its body becomes
    a new stream of the same graph that starts empty (SGLang runs such a call as a program
    of its own). Its arguments may be the caller's variables or arguments (one left out takes
    its default); the returned state gives its variables to the caller
    (`branch["detailed_tip"]`)."""
    builder = active_builder()
    assert builder is not None, "trace_call outside a trace"
    unknown = [a for a in arguments if a not in params]
    if unknown:
        raise TracingError(f"{name} has no parameters {unknown}")
    stream = builder.new_stream(None)
    builder.add(stream, SubProgram(name))
    state = TracerState(builder, stream)
    func(state, **arguments)
    return state


def trace_program(
    func: Callable[..., Any],
    name: str,
    params: Sequence[str],
    bound: Mapping[str, Any],
    *,
    partial: bool = False,
) -> ProgramGraph:
    """Traces `func(s, **arguments)`; parameters not in `bound` become `Argument`s. With
    `partial`, a program that cannot be traced to its end gives the graph traced until then
    (what SGLang warms as a program's prefix) instead of an error."""
    builder = _Builder()
    arguments = {p: bound[p] if p in bound else Argument(p) for p in params}
    try:
        with _tracing(builder):
            func(TracerState(builder, 0), **arguments)
    except Exception as exc:
        if partial:
            pass
        elif isinstance(exc, TracingError):
            raise
        else:
            raise TracingError(f"cannot trace {name}: {type(exc).__name__}: {exc}") from exc
    return ProgramGraph(
        name=name,
        nodes=tuple(builder.nodes),
        arguments=tuple(p for p in params if p not in bound),
        num_streams=builder.num_streams,
    )
