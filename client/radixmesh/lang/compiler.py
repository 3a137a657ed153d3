"""Compiler mode (paper appendix D): a traced program as a graph of typed IR nodes.

`ProgramGraph.nodes` are in trace order, which is a topological order of both kinds of
dependency: intra-stream (each node after the previous node of its stream) and inter-stream
(a fork before its branches' first nodes, a variable's producer before its readers, a join
after its branches). The graph executor therefore dispatches nodes in that order to one
stream executor per stream, exactly like the interpreter, without re-running Python code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from radixmesh.lang.backend import Backend
from radixmesh.lang.config import get_default_backend
from radixmesh.lang.context import ProgramContext
from radixmesh.lang.interpreter import StreamExecutor
from radixmesh.lang.ir import (
    Argument,
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
    Text,
    Variable,
    VarScopeBegin,
    VarScopeEnd,
)
from radixmesh.lang.params import GenParams, split_sampling
from radixmesh.lang.roles import RoleRenderer
from radixmesh.lang.state import ForkGroup, ProgramState


@dataclass(frozen=True)
class GraphNode:
    id: int
    stream: int
    op: GraphOp


@dataclass(frozen=True)
class TracedNode(GraphNode):
    """A node together with its graph, as `ProgramGraph.last_node` returns it."""

    graph: ProgramGraph = field(repr=False, compare=False)

    def print_graph_dfs(self) -> str:
        return self.graph.print_graph_dfs(self.id)


def _params_text(params: GenParams) -> str:
    default = GenParams()
    parts = [
        f"{f.name}={getattr(params, f.name)!r}"
        for f in fields(params)
        if getattr(params, f.name) != getattr(default, f.name)
    ]
    return " {" + ", ".join(parts) + "}" if parts else ""


def describe(op: GraphOp) -> str:
    """One-line, human-readable form of a node's operator."""
    if isinstance(op, Text):
        return f"text {op.value!r}"
    if isinstance(op, Argument):
        return f"argument {op.name}"
    if isinstance(op, Variable):
        source = "" if op.source is None else f" <- %{op.source}"
        return f"variable {op.name!r} of stream {op.stream}{source}"
    if isinstance(op, Gen):
        return f"gen {op.name!r}{_params_text(op.params)}"
    if isinstance(op, Select):
        return f"select {op.name!r} {list(op.choices)!r} by {op.method.name}"
    if isinstance(op, RoleBegin):
        return f"begin {op.role}"
    if isinstance(op, RoleEnd):
        return f"end {op.role}"
    if isinstance(op, Fork):
        return "fork -> streams " + ", ".join(str(s) for s in op.streams)
    if isinstance(op, GetForkItem):
        return f"get_fork_item %{op.fork}[{op.index}]"
    if isinstance(op, VarScopeBegin | VarScopeEnd):
        return f"var_scope {op.name!r} {'begin' if isinstance(op, VarScopeBegin) else 'end'}"
    if isinstance(op, SubProgram):
        return f"call {op.name}"
    if isinstance(op, SeparateReasoning):
        return f"separate_reasoning {op.gen_name!r}"
    return f"join %{op.fork} ({op.mode})"


@dataclass(frozen=True)
class ProgramGraph:
    """A traced program: `nodes` in topological (trace) order; `arguments` are unbound."""

    name: str
    nodes: tuple[GraphNode, ...]
    arguments: tuple[str, ...]
    num_streams: int

    @property
    def last_node(self) -> TracedNode | None:
        """The root stream's last node (SGLang's `trace().last_node`), which can print the
        graph it depends on (`print_graph_dfs()`)."""
        nodes = self.stream_nodes(0)
        if not nodes:
            return None
        last = nodes[-1]
        return TracedNode(last.id, last.stream, last.op, self)

    def print_graph_dfs(self, node_id: int) -> str:
        """SGLang's `node.print_graph_dfs()`: every node `node_id` depends on, and itself, in
        dependency order, one per line: `%id = %prev + <op>` where %prev is the previous
        node of the same stream, or `%id = <op>` for a stream's first node."""
        preds: dict[int, list[int]] = {}
        for producer, consumer in self.dependencies():
            preds.setdefault(consumer, []).append(producer)
        needed: set[int] = set()
        stack = [node_id]
        while stack:
            n = stack.pop()
            if n not in needed:
                needed.add(n)
                stack.extend(preds.get(n, ()))
        lines: list[str] = []
        last: dict[int, int] = {}
        for node in self.nodes:  # trace order is a topological order
            prev = last.get(node.stream)
            last[node.stream] = node.id
            if node.id not in needed:
                continue
            head = f"%{node.id} = " + ("" if prev is None else f"%{prev} + ")
            lines.append(head + describe(node.op))
        return "\n".join(lines) + "\n"

    def stream_nodes(self, stream: int) -> list[GraphNode]:
        return [n for n in self.nodes if n.stream == stream]

    def dependencies(self) -> list[tuple[int, int]]:
        """(producer, consumer) node-id edges, intra- and inter-stream."""
        edges: list[tuple[int, int]] = []
        last: dict[int, int] = {}
        forks: dict[int, Fork] = {}
        for node in self.nodes:
            if node.stream in last:
                edges.append((last[node.stream], node.id))
            op = node.op
            if isinstance(op, GetForkItem):
                edges.append((op.fork, node.id))
            elif isinstance(op, Variable) and op.source is not None:
                if (op.source, node.id) not in edges:
                    edges.append((op.source, node.id))
            elif isinstance(op, Join):
                edges += [(last[s], node.id) for s in forks[op.fork].streams if s in last]
            if isinstance(op, Fork):
                forks[node.id] = op
            last[node.stream] = node.id
        return edges

    def __str__(self) -> str:
        lines = [
            f"graph {self.name}({', '.join(self.arguments)}): "
            f"{len(self.nodes)} nodes, {self.num_streams} streams"
        ]
        for stream in range(self.num_streams):
            nodes = self.stream_nodes(stream)
            lines.append(f"stream {stream}:")
            lines += [f"  %{n.id} = {describe(n.op)}" for n in nodes]
        return "\n".join(lines)

    def constant_prefix(self, renderer: Callable[[], RoleRenderer]) -> str:
        """The prompt text every run starts with: the root stream's leading constant text and
        roles, rendered exactly as the interpreter will render them."""
        out: list[str] = []
        first_role = True
        for node in self.stream_nodes(0):
            op = node.op
            if isinstance(op, Text):
                out.append(op.value)
            elif isinstance(op, RoleBegin):
                out.append(renderer().begin(op.role, first=first_role))
                first_role = False
            elif isinstance(op, RoleEnd):
                out.append(renderer().end(op.role))
            else:
                break
        return "".join(out)

    def run(
        self, *, backend: Backend | None = None, stream: bool = False, **kwargs: Any
    ) -> ProgramState:
        """Executes the graph with `kwargs` for its arguments (plus sampling defaults such
        as temperature=0); returns the root state at once, like `SglFunction.run`."""
        values, defaults = split_sampling(kwargs, set(self.arguments))
        missing = [a for a in self.arguments if a not in values]
        extra = [k for k in values if k not in self.arguments]
        if missing or extra:
            raise TypeError(f"{self.name}: missing arguments {missing}, unexpected {extra}")
        ctx = ProgramContext.create(backend or get_default_backend(), defaults, stream=stream)
        root = ProgramState(StreamExecutor(ctx))
        try:
            self._dispatch(root, values)
        except BaseException as exc:
            root._executor.program_error = exc
            raise
        finally:
            root._executor.end()
        return root

    def run_batch(
        self,
        batch_kwargs: Sequence[Mapping[str, Any]],
        *,
        backend: Backend | None = None,
        **sampling: Any,
    ) -> list[ProgramState]:
        """`run` for each kwargs mapping, all in flight at once; finished states in order."""
        states = [self.run(backend=backend, **sampling, **kwargs) for kwargs in batch_kwargs]
        return [s.wait() for s in states]

    def _dispatch(self, root: ProgramState, values: dict[str, Any]) -> None:
        states: dict[int, ProgramState] = {0: root}
        groups: dict[int, ForkGroup] = {}
        for node in self.nodes:
            op = node.op
            if isinstance(op, SubProgram):  # a called program's stream starts empty
                states[node.stream] = ProgramState(root._executor.spawn())
                continue
            state = states[node.stream]
            if isinstance(op, Argument):
                value = values[op.name]
                state += value if isinstance(value, str) else str(value)
            elif isinstance(op, Variable):
                future = states[op.stream]._executor.var_future(op.name)
                state._executor.submit_value(future, f"variable {op.name!r}")
            elif isinstance(op, Fork):
                group = state.fork(len(op.streams))
                groups[node.id] = group
                for child_stream, child in zip(op.streams, group, strict=True):
                    states[child_stream] = child
            elif isinstance(op, GetForkItem):
                continue  # the branch state was created by its fork
            elif isinstance(op, Join):
                groups[op.fork].join(op.mode)
            else:
                state += op
