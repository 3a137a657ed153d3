"""Grammar operations collected between two mask steps (pure bookkeeping, no I/O).

The grammar service applies a step's parts in a fixed order: releases, binds, rollbacks,
accepts, masks. So a request that is bound and released before the next step is simply
forgotten here, and tokens accepted by a request that is then released are dropped, since the
service would reject an accept for a handle it has already released.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixmesh_wire.mask_step_ops import Bind, MaskStepPlan


class GrammarOps:
    def __init__(self) -> None:
        self.binds: dict[int, tuple[str, str, list[int]]] = {}
        self.rids: dict[int, str] = {}  # a bind's request id, for the grammar service's logs
        self.accepts: dict[int, list[int]] = {}
        self.releases: list[int] = []
        self.rollbacks: dict[int, int] = {}

    def bind(
        self, handle: int, kind: str, text: str, replay: Sequence[int] = (), rid: str = ""
    ) -> None:
        self.binds[handle] = (kind, text, list(replay))
        self.rids[handle] = rid

    def accept(self, handle: int, token: int) -> None:
        self.accepts.setdefault(handle, []).append(token)

    def rollback(self, handle: int, n: int) -> None:
        """Undo the last n accepted tokens. Must come after every accept already sent for
        them, since the service applies rollbacks before this step's accepts."""
        assert handle not in self.accepts, "rollback after pending accepts is ambiguous"
        self.rollbacks[handle] = self.rollbacks.get(handle, 0) + n

    def release(self, handle: int) -> None:
        self.accepts.pop(handle, None)
        self.rollbacks.pop(handle, None)
        self.rids.pop(handle, None)
        if self.binds.pop(handle, None) is None:  # bound by an earlier step: tell the service
            self.releases.append(handle)

    def clear(self) -> None:
        self.binds.clear()
        self.rids.clear()
        self.accepts.clear()
        self.releases.clear()
        self.rollbacks.clear()

    def __bool__(self) -> bool:
        return bool(self.binds or self.accepts or self.releases or self.rollbacks)

    def build(self, step_id: int, want: Sequence[int], jump: Sequence[int] = ()) -> MaskStepPlan:
        """The mask step of everything collected (then forgotten here), asking for the masks
        of `want` and jump-forwards of `jump` (a subset of `want`)."""
        jumps = set(jump)
        plan = MaskStepPlan(
            step_id,
            releases=self.releases,
            binds=[
                Bind(h, kind, text, replay, self.rids.get(h, ""))
                for h, (kind, text, replay) in self.binds.items()
            ],
            rollbacks=[(h, n) for h, n in self.rollbacks.items() if n],
            accepts=self.accepts,
            want=list(want),
            jump=[h for h in want if h in jumps],
        )
        # New containers, not clear(): the plan keeps the old ones.
        self.binds, self.accepts, self.releases, self.rollbacks = {}, {}, [], {}
        self.rids = {}
        return plan
