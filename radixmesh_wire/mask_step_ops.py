"""Typed grammar mask steps (no protobuf): what the scheduler asks of the grammar service in
one step and what it gets back. `mask_step` converts them to and from grammar.proto."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixmesh_wire.mask_rows import EncodedRow

# GrammarErrorCode GRAMMAR_ERROR_COMPILE (a unit test checks the number): the row failed because
# its request's grammar does not compile, a client error; any other code is the service's.
ERROR_COMPILE = 3


@dataclass(frozen=True)
class Bind:
    handle: int
    kind: str  # json_schema, regex or ebnf
    text: str
    replay: list[int]  # tokens the request already accepted (a re-bind after a restart)
    rid: str = ""  # the request's id: the grammar service's log lines about it name it


@dataclass
class MaskStepPlan:
    """Everything one mask step asks of the grammar service. The service applies the parts in
    this order: releases, binds (with replay), rollbacks, accepts, then computes masks."""

    step_id: int
    releases: list[int] = field(default_factory=list)
    binds: list[Bind] = field(default_factory=list)
    rollbacks: list[tuple[int, int]] = field(default_factory=list)  # (handle, tokens to undo)
    accepts: dict[int, list[int]] = field(default_factory=dict)  # handle -> tokens, in order
    want: list[int] = field(default_factory=list)  # rows whose next-token mask is wanted
    jump: list[int] = field(default_factory=list)  # the subset that wants a jump-forward too


@dataclass(frozen=True, slots=True)
class RowFailure:
    handle: int
    code: int  # GrammarErrorCode (ERROR_COMPILE: the grammar itself)
    message: str


@dataclass
class MaskStepOutcome:
    """Columns, no object per row beyond its `EncodedRow` (this runs for every constrained row
    of every step)."""

    step_id: int
    # One per wanted row, by handle, in `want` order; a row whose grammar failed has encoding
    # NONE and an entry in `errors`.
    rows: dict[int, EncodedRow] = field(default_factory=dict)
    jumps: dict[int, tuple[int, list[int]]] = field(default_factory=dict)  # (rollback, tokens)
    errors: list[RowFailure] = field(default_factory=list)
