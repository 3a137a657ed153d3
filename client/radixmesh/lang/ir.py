"""Typed IR of SGLang programs (paper appendix D): expressions and graph operators.

Expressions are what `s += ...` accepts: `Text`, `Argument`, `Variable`, `Gen`, `Select`,
`RoleBegin`, `RoleEnd`, and the composites `Role` and `Concat` that `flatten` expands into
those leaves. `Fork`, `GetForkItem`, `Join` and `SubProgram` only appear as nodes of a traced
graph.

Invariants:
- Nodes are immutable and compared by identity (two equal-looking gens are two calls).
- `flatten` preserves program order; a program's prompt is its leaves rendered in order.
- `Argument` and `Variable` are trace-time placeholders. Using one as data (`==`, `bool`,
  `len`) raises `TracingError`. An `Argument` in an f-string raises `ArgumentFormatError` (a
  TypeError, as SGLang refuses it: write `"Q: " + question`); `str()` of one, and a
  `Variable` in an f-string, yield a sentinel that the tracer turns back into the node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixmesh.lang.errors import ArgumentFormatError, TracingError
from radixmesh.lang.params import GenParams

if TYPE_CHECKING:
    from radixmesh.lang.choices import ChoicesMethod

ROLES = ("system", "user", "assistant")

#: SGLang's public regexes (defined here as in `sglang.lang.ir`; `gen(dtype=...)` uses them).
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""


class Expr:
    """Base of everything appendable to a prompt state; `+` builds a `Concat`."""

    __slots__ = ()

    def __add__(self, other: Expr | str) -> Concat:
        return Concat((self, _as_expr(other)))

    def __radd__(self, other: Expr | str) -> Concat:
        return Concat((_as_expr(other), self))

    def __format__(self, spec: str) -> str:
        # A silent repr inside an f-string would corrupt the prompt; make it loud instead.
        raise TypeError(f"{type(self).__name__} cannot be formatted into a string; use '+'")


@dataclass(frozen=True, eq=False)
class Text(Expr):
    """Constant text (the paper's ConstantText)."""

    value: str


@dataclass(frozen=True, eq=False)
class Gen(Expr):
    """Generate text with `params`; stored under `name` when given."""

    name: str | None
    params: GenParams


@dataclass(frozen=True, eq=False)
class Select(Expr):
    """Append the best of `choices` by `method`; stored under `name` when given."""

    name: str | None
    choices: tuple[str, ...]
    method: ChoicesMethod


@dataclass(frozen=True, eq=False)
class RoleBegin(Expr):
    role: str


@dataclass(frozen=True, eq=False)
class RoleEnd(Expr):
    role: str


@dataclass(frozen=True, eq=False)
class VarScopeBegin(Expr):
    """Start of `s.var_scope(name)`: the text appended until `VarScopeEnd` becomes `s[name]`."""

    name: str


@dataclass(frozen=True, eq=False)
class VarScopeEnd(Expr):
    name: str


@dataclass(frozen=True, eq=False, repr=False)
class SeparateReasoning(Expr):
    """After gen `gen_name`: split its `<think>...</think>` part into the variable `name`
    (`gen_name + "_reasoning_content"`, as SGLang names it) and keep only the answer in
    `s[gen_name]` (the prompt text keeps both). `model_type` is SGLang's reasoning-parser name,
    kept for programs that read it; every model uses the think markers."""

    gen_name: str
    model_type: str | None = None
    begin: str = "<think>"
    end: str = "</think>"

    @property
    def name(self) -> str:
        return self.process_name_for_reasoning(self.gen_name)

    @staticmethod
    def process_name_for_reasoning(name: str) -> str:
        return name + "_reasoning_content"

    def __repr__(self) -> str:
        return f"SeparateReasoning(model_type={self.model_type}, name={self.name})"


@dataclass(frozen=True, eq=False)
class Role(Expr):
    """`RoleBegin(role)`, the content, `RoleEnd(role)`; content None means empty."""

    role: str
    content: Expr | None


@dataclass(frozen=True, eq=False)
class Concat(Expr):
    parts: tuple[Expr, ...]

    @property
    def expr_list(self) -> list[Expr]:
        """SGLang's name for the parts (`SglExprList.expr_list`)."""
        return list(self.parts)


class _Placeholder(Expr):
    """Shared behaviour of trace-time placeholders (see module docstring)."""

    __slots__ = ()

    def _sentinel(self) -> str:
        raise NotImplementedError

    def __format__(self, spec: str) -> str:
        return self._sentinel()

    def __str__(self) -> str:
        return self._sentinel()

    def __eq__(self, other: object) -> bool:
        raise TracingError(f"{self!r} is only known at run time: data-dependent control flow")

    def __bool__(self) -> bool:
        raise TracingError(f"{self!r} is only known at run time: data-dependent control flow")

    __hash__ = object.__hash__


@dataclass(frozen=True, eq=False, repr=True)
class Argument(_Placeholder):
    """A program argument not bound at trace time."""

    name: str

    def _sentinel(self) -> str:
        return f"\x00rm:arg:{self.name}\x00"

    def __format__(self, spec: str) -> str:
        raise ArgumentFormatError(
            f"argument {self.name!r} cannot be put inside an f-string while tracing (its value "
            f'is unknown); concatenate it instead: "..." + {self.name} + "..."'
        )

    __eq__ = _Placeholder.__eq__
    __hash__ = _Placeholder.__hash__


@dataclass(frozen=True, eq=False, repr=True)
class Variable(_Placeholder):
    """The value of variable `name` of stream `stream`, produced by graph node `source`."""

    name: str
    stream: int
    source: int | None = None

    def _sentinel(self) -> str:
        source = -1 if self.source is None else self.source
        return f"\x00rm:var:{self.stream}:{source}:{self.name}\x00"

    __eq__ = _Placeholder.__eq__
    __hash__ = _Placeholder.__hash__


@dataclass(frozen=True, eq=False)
class Fork:
    """Graph node: copy this stream's prompt into `streams` (one new stream each)."""

    streams: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class GetForkItem:
    """Graph node: the first node of a forked stream, `index` of fork node `fork`."""

    fork: int
    index: int


@dataclass(frozen=True, eq=False)
class SubProgram:
    """Graph node: the first node of a stream that starts empty, a call of program `name`
    traced from inside another program (`expand(tip=s["tip"])` without a state)."""

    name: str


@dataclass(frozen=True, eq=False)
class Join:
    """Graph node: end the streams of fork node `fork` and merge them (`gather`/`concat`)."""

    fork: int
    mode: str


#: Leaves the interpreter executes; composites are flattened away first.
Leaf = (
    Text
    | Gen
    | Select
    | RoleBegin
    | RoleEnd
    | Argument
    | Variable
    | VarScopeBegin
    | VarScopeEnd
    | SeparateReasoning
)
GraphOp = Leaf | Fork | GetForkItem | Join | SubProgram

_LEAVES = (
    Gen,
    Select,
    RoleBegin,
    RoleEnd,
    Argument,
    Variable,
    VarScopeBegin,
    VarScopeEnd,
    SeparateReasoning,
)
_SENTINEL = re.compile("\x00rm:(arg|var):([^\x00]*)\x00")


def _as_expr(value: Any) -> Expr:
    if value is None:
        raise ValueError("tried to append None to a prompt")
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    raise TypeError(f"cannot append {type(value).__name__} to a prompt; use str or a primitive")


def split_sentinels(text: str) -> list[Leaf]:
    """Turns text that may carry formatted placeholders back into Text/Argument/Variable."""
    out: list[Leaf] = []
    pos = 0
    for m in _SENTINEL.finditer(text):
        if m.start() > pos:
            out.append(Text(text[pos : m.start()]))
        if m.group(1) == "arg":
            out.append(Argument(m.group(2)))
        else:
            stream, source, name = m.group(2).split(":", 2)
            src = int(source)
            out.append(Variable(name, int(stream), None if src < 0 else src))
        pos = m.end()
    if pos < len(text):
        out.append(Text(text[pos:]))
    return out


def flatten(value: Expr | str) -> list[Leaf]:
    """Leaves of `value` in program order; empty Text is dropped. Raises TypeError on junk."""
    if value is None:
        raise ValueError("tried to append None to a prompt")
    out: list[Leaf] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            leaves = split_sentinels(item) if "\x00rm:" in item else [Text(item)]
            out.extend(x for x in leaves if not (isinstance(x, Text) and not x.value))
        elif isinstance(item, Concat):
            stack.extend(reversed(item.parts))
        elif isinstance(item, Role):
            stack.append(RoleEnd(item.role))
            if item.content is not None:
                stack.append(item.content)
            stack.append(RoleBegin(item.role))
        elif isinstance(item, Text):
            if "\x00rm:" in item.value:  # `f"{arg}" + gen(...)` wraps the sentinel in a Text
                stack.append(item.value)
            elif item.value:
                out.append(item)
        elif isinstance(item, _LEAVES):
            out.append(item)
        else:
            raise TypeError(
                f"cannot append {type(item).__name__} to a prompt; use str or a primitive"
            )
    return out


# ---- SGLang's names (`from sglang.lang.ir import ...` works with `radixmesh.lang.ir`) ------
# The classes are RadixMesh's own: `isinstance` checks and the attributes SGLang programs read
# (`expr_list`, `name`, `model_type`, `role`, `value`) work; constructors take RadixMesh's
# fields (build expressions with the primitives, `rm.gen(...)`, not with these classes).
SglExpr = Expr
SglExprList = Concat
SglConstantText = Text
SglGen = Gen
SglSelect = Select
SglRoleBegin = RoleBegin
SglRoleEnd = RoleEnd
SglVarScopeBegin = VarScopeBegin
SglVarScopeEnd = VarScopeEnd
SglSeparateReasoning = SeparateReasoning
SglArgument = Argument
SglVariable = Variable
SglFork = Fork
SglGetForkItem = GetForkItem
SglSamplingParams = GenParams


def __getattr__(name: str) -> Any:
    # SglFunction lives in `function.py`, which imports this module: resolve it on first use.
    if name == "SglFunction":
        from radixmesh.lang.function import SglFunction

        return SglFunction
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
