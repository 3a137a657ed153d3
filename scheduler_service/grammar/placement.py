"""Which grammar service holds each constrained request's matcher, and splitting one mask step
into the parts each service must see (pure bookkeeping, no I/O).

Invariants:
- A handle is owned by at most one service, from the step that sends its bind until the step
  that sends its release (or until that service is lost). Every operation on a handle (release,
  rollback, accept, mask, jump) goes to its owner; binds are placed when they are sent.
- A service's parts of one step keep the step's order of operations (releases, binds,
  rollbacks, accepts, masks), so each service sees exactly the sequence a lone service would
  have seen for the handles it owns.
- Operations on a handle nobody owns are dropped: its service was lost and its request is
  re-bound with replay (the scheduler's log of accepted tokens is the truth), or it was
  released. A wanted row nobody owns is reported `orphaned`, so it waits instead of sampling
  without a mask.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from radixmesh_wire.mask_step_ops import MaskStepOutcome, MaskStepPlan

GrammarKey = tuple[str, str]  # (kind, text)

AFFINITY_ENTRIES = 4096  # grammars remembered with the service that compiled them


@dataclass
class SplitStep:
    parts: dict[str, MaskStepPlan]  # by service address; only services with work
    orphaned: list[int] = field(default_factory=list)  # wanted rows that no service owns
    unplaced: list[int] = field(default_factory=list)  # binds with no service connected


class Placement:
    def __init__(self) -> None:
        self.owner: dict[int, str] = {}  # handle -> address
        self.live: dict[str, int] = {}  # address -> matchers it holds (live handles)
        # Handles whose matchers a still-connected service must forget before the next step
        # (their rows were lost to an unreadable reply; they are re-bound with replay).
        self.stale: dict[str, list[int]] = {}
        self._compiled_on: OrderedDict[GrammarKey, str] = OrderedDict()

    # -- placement ------------------------------------------------------------------------------
    def least_loaded(self, up: Sequence[str], key: GrammarKey | None = None) -> str | None:
        """The connected service with the fewest live matchers; ties go to the one that
        compiled `key` (its compile cache is warm), then to the first in `up`."""
        if not up:
            return None
        warm = self._compiled_on.get(key) if key is not None else None
        return min(up, key=lambda a: (self.live.get(a, 0), a != warm))

    def compiled(self, key: GrammarKey, address: str) -> None:
        self._compiled_on[key] = address
        self._compiled_on.move_to_end(key)
        while len(self._compiled_on) > AFFINITY_ENTRIES:
            self._compiled_on.popitem(last=False)

    def drop(self, address: str, *, still_connected: bool = False) -> list[int]:
        """Forget every matcher on `address` (lost, removed, or its reply unreadable) and return
        their handles, for the scheduler to re-bind elsewhere with replay. `still_connected`:
        the service keeps its session, so it is told to release them in the next step."""
        handles = [h for h, a in self.owner.items() if a == address]
        for h in handles:
            del self.owner[h]
        self.live.pop(address, None)
        if still_connected and handles:
            self.stale.setdefault(address, []).extend(handles)
        elif not still_connected:
            self.stale.pop(address, None)
        return handles

    # -- one step -------------------------------------------------------------------------------
    def split(self, plan: MaskStepPlan, up: Sequence[str]) -> SplitStep:
        """Route a step's operations to the owners of their handles, placing its binds on the
        least loaded connected services (which then own them)."""
        parts: dict[str, MaskStepPlan] = {}

        def part(address: str) -> MaskStepPlan:
            p = parts.get(address)
            if p is None:
                p = parts[address] = MaskStepPlan(plan.step_id)
            return p

        owner = self.owner
        for stale in list(self.stale):
            if stale in up:
                part(stale).releases.extend(self.stale.pop(stale))
        for h in plan.releases:
            released = owner.pop(h, None)
            if released is not None:
                self.live[released] -= 1
                part(released).releases.append(h)
        unplaced: list[int] = []
        for b in plan.binds:
            target = owner.get(b.handle) or self.least_loaded(up, (b.kind, b.text))
            if target is None:  # nothing connected: the request must be bound again later
                unplaced.append(b.handle)
                continue
            if b.handle not in owner:
                owner[b.handle] = target
                self.live[target] = self.live.get(target, 0) + 1
            part(target).binds.append(b)
        for h, n in plan.rollbacks:
            if (at := owner.get(h)) is not None:
                part(at).rollbacks.append((h, n))
        for h, tokens in plan.accepts.items():
            if (at := owner.get(h)) is not None:
                part(at).accepts[h] = tokens
        jump = set(plan.jump)
        orphaned: list[int] = []
        for h in plan.want:
            at = owner.get(h)
            if at is None or at not in up:
                orphaned.append(h)
                continue
            p = part(at)
            p.want.append(h)
            if h in jump:
                p.jump.append(h)
        return SplitStep(parts, orphaned, unplaced)


def gather(
    step_id: int, want: Sequence[int], outcomes: Sequence[MaskStepOutcome]
) -> MaskStepOutcome:
    """One step's outcome from its parts' outcomes: rows in `want` order (rows not answered
    are simply absent), every jump and error."""
    merged = MaskStepOutcome(step_id)
    rows = {}
    for o in outcomes:
        rows.update(o.rows)
        merged.jumps.update(o.jumps)
        merged.errors.extend(o.errors)
    merged.rows = {h: rows[h] for h in want if h in rows}
    return merged
