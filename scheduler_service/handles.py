"""Small integer handles naming requests on the step stream (reused after release)."""

from __future__ import annotations


class HandlePool:
    def __init__(self) -> None:
        self._free: list[int] = []
        self._next = 0

    def take(self) -> int:
        if self._free:
            return self._free.pop()
        self._next += 1
        return self._next - 1

    def give(self, handle: int) -> None:
        self._free.append(handle)

    def reset(self) -> None:
        self._free.clear()
        self._next = 0
