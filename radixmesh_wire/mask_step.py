"""grammar.proto mask steps <-> the typed `mask_step_ops` (`encode_mask_step`: MaskStepPlan ->
MaskStep; `decode_mask_result`: MaskStepResult -> MaskStepOutcome), and a builder that collects
a step's operations.

The scheduler's `GrammarOps` plans a step and its grammar link encodes it here; tests and
benchmarks use `MaskStepBuilder`. Operations may be added in any order: the service applies them
in its fixed order (releases, binds, rollbacks, accepts, masks), so a caller only has to
remember what happened to each request since the last step.

    b = MaskStepBuilder()
    b.bind(7, "json_schema", schema)       # at admission (after Compile said ok)
    b.accept(3, [token])                   # after each sampled token of a running request
    b.want(3, jump_forward=True)           # rows constrained in the next forward pass
    msg = b.build(step_id)                 # -> pb.MaskStep; the builder is empty again
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from radixmesh_wire.mask_rows import EncodedRow, MaskEncoding
from radixmesh_wire.mask_step_ops import (
    ERROR_COMPILE,
    Bind,
    MaskStepOutcome,
    MaskStepPlan,
    RowFailure,
)
from radixmesh_wire.packing import pack_i32, unpack_i32
from radixmesh_wire.pb import grammar_pb2 as pb

__all__ = [
    "ERROR_COMPILE",
    "Bind",
    "MaskStepBuilder",
    "MaskStepOutcome",
    "MaskStepPlan",
    "RowFailure",
    "decode_mask_result",
    "encode_mask_step",
    "grammar_spec",
]

KIND_TO_PB: dict[str, int] = {
    "json_schema": pb.GRAMMAR_KIND_JSON_SCHEMA,
    "regex": pb.GRAMMAR_KIND_REGEX,
    "ebnf": pb.GRAMMAR_KIND_EBNF,
}

_ENCODING = {int(e): e for e in MaskEncoding}


def grammar_spec(kind: str, text: str) -> pb.GrammarSpec:
    """`kind` is json_schema, regex or ebnf (the api.proto constraint field names)."""
    try:
        return pb.GrammarSpec(kind=KIND_TO_PB[kind], text=text)  # type: ignore[arg-type]
    except KeyError:
        raise ValueError(f"unknown grammar kind {kind!r}") from None


def encode_mask_step(plan: MaskStepPlan) -> pb.MaskStep:
    handles = list(plan.accepts)
    counts = [len(plan.accepts[h]) for h in handles]
    return pb.MaskStep(
        step_id=plan.step_id,
        release_handles=pack_i32(plan.releases),
        binds=[
            pb.Bind(
                handle=b.handle,
                grammar=grammar_spec(b.kind, b.text),
                replay_tokens=pack_i32(b.replay),
                rid=b.rid,
            )
            for b in plan.binds
        ],
        rollbacks=[pb.Rollback(handle=h, num_tokens=n) for h, n in plan.rollbacks if n],
        accept_handles=pack_i32(handles),
        # One token each (the plain decode step) travels without counts.
        accept_counts=b"" if all(c == 1 for c in counts) else pack_i32(counts),
        accept_tokens=pack_i32([t for h in handles for t in plan.accepts[h]]),
        mask_handles=pack_i32(plan.want),
        jump_forward_handles=pack_i32(plan.jump),
    )


def decode_mask_result(res: pb.MaskStepResult, jumps_asked: bool = True) -> MaskStepOutcome:
    """`jumps_asked`: the step asked for jump-forwards (else their per-row field is not read:
    this runs for every constrained row of every step)."""
    out = MaskStepOutcome(res.step_id)
    rows, jumps, enc_of = out.rows, out.jumps, _ENCODING.get
    for m in res.rows:
        h = m.handle
        enc = enc_of(m.encoding)
        if enc is None:
            raise ValueError(f"mask row of handle {h}: unknown encoding {m.encoding}")
        rows[h] = EncodedRow(enc, m.data)
        if jumps_asked:
            jf = m.jump_forward
            if jf.tokens:
                jumps[h] = (jf.rollback, unpack_i32(jf.tokens))
    out.errors = [RowFailure(e.handle, e.code, e.message) for e in res.errors]
    return out


class MaskStepBuilder:
    """Collects one step's operations; `build` encodes them and starts an empty step."""

    def __init__(self) -> None:
        self._plan = MaskStepPlan(0)

    def release(self, handle: int) -> None:
        self._plan.releases.append(handle)

    def bind(self, handle: int, kind: str, text: str, replay: Sequence[int] = ()) -> None:
        grammar_spec(kind, text)  # an unknown kind fails here, at the call that names it
        self._plan.binds.append(Bind(handle, kind, text, list(replay)))

    def rollback(self, handle: int, num_tokens: int) -> None:
        if num_tokens:
            self._plan.rollbacks.append((handle, num_tokens))

    def accept(self, handle: int, tokens: Iterable[int]) -> None:
        self._plan.accepts.setdefault(handle, []).extend(int(t) for t in tokens)

    def want(self, handle: int, jump_forward: bool = False) -> None:
        self._plan.want.append(handle)
        if jump_forward:
            self._plan.jump.append(handle)

    def __bool__(self) -> bool:
        p = self._plan
        return bool(p.releases or p.binds or p.rollbacks or p.accepts or p.want)

    def build(self, step_id: int) -> pb.MaskStep:
        plan, self._plan = self._plan, MaskStepPlan(0)
        plan.step_id = step_id
        return encode_mask_step(plan)
