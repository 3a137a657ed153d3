"""Client-side helper: collect one step's grammar operations and pack them into a MaskStep.

For the scheduler's grammar link (and tests, benchmarks). Operations may be added in any order;
the service applies them in its fixed order (releases, binds, rollbacks, accepts, masks), so a
caller only has to remember what happened to each request since the last step.

    b = MaskStepBuilder()
    b.bind(7, "json_schema", schema)       # at admission (after Compile said ok)
    b.accept(3, [token])                   # after each sampled token of a running request
    b.want(3, jump_forward=True)           # rows constrained in the next forward pass
    msg = b.build(step_id)                 # -> pb.MaskStep; the builder is empty again
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from radixmesh_wire.packing import pack_i32
from radixmesh_wire.pb import grammar_pb2 as pb

KIND_TO_PB: dict[str, int] = {
    "json_schema": pb.GRAMMAR_KIND_JSON_SCHEMA,
    "regex": pb.GRAMMAR_KIND_REGEX,
    "ebnf": pb.GRAMMAR_KIND_EBNF,
}


def grammar_spec(kind: str, text: str) -> pb.GrammarSpec:
    """`kind` is json_schema, regex or ebnf (the api.proto constraint field names)."""
    try:
        return pb.GrammarSpec(kind=KIND_TO_PB[kind], text=text)  # type: ignore[arg-type]
    except KeyError:
        raise ValueError(f"unknown grammar kind {kind!r}") from None


class MaskStepBuilder:
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._releases: list[int] = []
        self._binds: list[pb.Bind] = []
        self._rollbacks: list[pb.Rollback] = []
        self._accepts: dict[int, list[int]] = {}
        self._want: list[int] = []
        self._jump: list[int] = []

    def release(self, handle: int) -> None:
        self._releases.append(handle)

    def bind(self, handle: int, kind: str, text: str, replay: Sequence[int] = ()) -> None:
        self._binds.append(
            pb.Bind(handle=handle, grammar=grammar_spec(kind, text), replay_tokens=pack_i32(replay))
        )

    def rollback(self, handle: int, num_tokens: int) -> None:
        if num_tokens:
            self._rollbacks.append(pb.Rollback(handle=handle, num_tokens=num_tokens))

    def accept(self, handle: int, tokens: Iterable[int]) -> None:
        self._accepts.setdefault(handle, []).extend(int(t) for t in tokens)

    def want(self, handle: int, jump_forward: bool = False) -> None:
        self._want.append(handle)
        if jump_forward:
            self._jump.append(handle)

    def __bool__(self) -> bool:
        return bool(self._releases or self._binds or self._rollbacks or self._accepts or self._want)

    def build(self, step_id: int) -> pb.MaskStep:
        handles = list(self._accepts)
        counts = [len(self._accepts[h]) for h in handles]
        msg = pb.MaskStep(
            step_id=step_id,
            release_handles=pack_i32(self._releases),
            binds=self._binds,
            rollbacks=self._rollbacks,
            accept_handles=pack_i32(handles),
            # One token each (the plain decode step) travels without counts.
            accept_counts=b"" if all(c == 1 for c in counts) else pack_i32(counts),
            accept_tokens=pack_i32(t for h in handles for t in self._accepts[h]),
            mask_handles=pack_i32(self._want),
            jump_forward_handles=pack_i32(self._jump),
        )
        self._reset()
        return msg
