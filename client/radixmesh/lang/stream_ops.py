"""The ops a stream executor runs (internal to the interpreter).

Each op carries `outputs`: the Futures it resolves. When an op fails or is skipped, the
executor fails every unresolved output with a chained `ProgramError`, so a reader never
waits forever on an op that will not run.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixmesh.lang.ir import Gen, Leaf, RoleBegin, RoleEnd, Select, VarScopeBegin, VarScopeEnd

if TYPE_CHECKING:
    from radixmesh.lang.interpreter import StreamExecutor


@dataclass(frozen=True)
class Snapshot:
    text: str
    messages: tuple[dict[str, str], ...]
    role: tuple[str, int] | None
    roles_started: bool


@dataclass(eq=False)
class Op:
    label: str
    outputs: list[Future[Any]] = field(default_factory=list)


@dataclass(eq=False)
class LeafOp(Op):
    leaf: Leaf | None = None
    source: Future[Any] | None = None  # SeparateReasoning: the gen's own variable


@dataclass(eq=False)
class Inherit(Op):
    snapshot: Future[Snapshot] = field(default_factory=Future)


@dataclass(eq=False)
class ForkPoint(Op):
    hint: bool = False


@dataclass(eq=False)
class Await(Op):
    value: Future[Any] = field(default_factory=Future)


@dataclass(eq=False)
class JoinOp(Op):
    children: list[StreamExecutor] = field(default_factory=list)
    mode: str = "gather"
    names: list[str] = field(default_factory=list)


@dataclass(eq=False)
class End(Op):
    pass


class Skipped(Exception):
    """Raised inside the executor for ops after a stream's first failure."""


def label_of(leaf: Leaf) -> str:
    if isinstance(leaf, Gen | Select):
        kind = "gen" if isinstance(leaf, Gen) else "select"
        return f"{kind} {leaf.name!r}" if leaf.name else kind
    if isinstance(leaf, RoleBegin | RoleEnd):
        return f"{leaf.role} role"
    if isinstance(leaf, VarScopeBegin | VarScopeEnd):
        return f"var_scope {leaf.name!r}"
    return "text"
