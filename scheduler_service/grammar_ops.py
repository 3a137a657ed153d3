"""Grammar operations collected between two mask steps (pure bookkeeping, no I/O).

The grammar service applies a step's parts in a fixed order: releases, binds, rollbacks,
accepts, masks. So a request that is bound and released before the next step is simply
forgotten here, and tokens accepted by a request that is then released are dropped, since the
service would reject an accept for a handle it has already released.
"""

from __future__ import annotations

from collections.abc import Sequence

from client.pb import grammar_pb2
from grammar_service.step_builder import MaskStepBuilder


class GrammarOps:
    def __init__(self) -> None:
        self.binds: dict[int, tuple[str, str, list[int]]] = {}
        self.accepts: dict[int, list[int]] = {}
        self.releases: list[int] = []

    def bind(self, handle: int, kind: str, text: str, replay: Sequence[int] = ()) -> None:
        self.binds[handle] = (kind, text, list(replay))

    def accept(self, handle: int, token: int) -> None:
        self.accepts.setdefault(handle, []).append(token)

    def release(self, handle: int) -> None:
        self.accepts.pop(handle, None)
        if self.binds.pop(handle, None) is None:  # bound by an earlier step: tell the service
            self.releases.append(handle)

    def clear(self) -> None:
        self.binds.clear()
        self.accepts.clear()
        self.releases.clear()

    def __bool__(self) -> bool:
        return bool(self.binds or self.accepts or self.releases)

    def build(self, step_id: int, want: Sequence[int]) -> grammar_pb2.MaskStep:
        b = MaskStepBuilder()
        for h in self.releases:
            b.release(h)
        for h, (kind, text, replay) in self.binds.items():
            b.bind(h, kind, text, replay)
        for h, toks in self.accepts.items():
            b.accept(h, toks)
        for h in want:
            b.want(h)
        self.clear()
        return b.build(step_id)
