"""What the branches of a `fork` are, whether they run (`state.ForkGroup`) or are traced
(`tracer.TracerForkGroup`): a fixed sequence of states that `+=` appends to. Only `join`
differs between the two, so it is the one thing each subclass writes.

Invariant: the branches are fixed at the fork; `forks[i] += x` appends to branch i in place
and Python's store-back of the same object is the only assignment allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, overload

from radixmesh.lang.ir import Expr


class _Branch(Protocol):
    def extend(self, other: Expr | str) -> None: ...

    def __getitem__(self, name: str) -> Any: ...


S = TypeVar("S", bound=_Branch)
G = TypeVar("G", bound="BranchGroup[Any]")
Appendable = Expr | str | Sequence[Expr | str] | Callable[[int], Expr | str]


class BranchGroup(Sequence[S]):
    """The branches of one fork; subclasses add `join`."""

    def __init__(self, states: list[S]) -> None:
        self._states = states

    @overload
    def __getitem__(self, index: int) -> S: ...
    @overload
    def __getitem__(self, index: slice) -> list[S]: ...
    def __getitem__(self, index: int | slice) -> S | list[S]:
        return self._states[index]

    def __len__(self) -> int:
        return len(self._states)

    def __setitem__(self, index: int, value: S) -> None:
        """Completes `forks[i] += x` (Python stores the branch back); branches are fixed."""
        if value is not self._states[index]:
            raise TypeError("fork branches cannot be replaced; append to them with +=")

    def __iadd__(self: G, other: Appendable) -> G:
        """Appends `other` to every branch, element i to branch i for a sequence, or
        `other(i)` to branch i for a function."""
        if isinstance(other, Expr | str):
            items: list[Expr | str] = [other] * len(self._states)
        elif callable(other):
            items = [other(i) for i in range(len(self._states))]
        else:
            items = list(other)
        if len(items) != len(self._states):
            raise ValueError(f"{len(items)} items for {len(self._states)} branches")
        for state, item in zip(self._states, items, strict=True):
            state.extend(item)  # `state += item`
        return self

    def values(self, name: str) -> list[Any]:
        """Variable `name` of every branch (a running fork waits for each)."""
        return [s[name] for s in self._states]

    def join(self, mode: str = "gather_variable") -> None:
        raise NotImplementedError
