"""A request's KV slots in sequence order, as a growable int64 numpy buffer.

Each step hands every row's whole slot list to attention; concatenating numpy views costs a
few microseconds in C where extending a Python list and converting it element by element cost
milliseconds at batch 256 (tens of thousands of slots per step).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class SlotSeq:
    __slots__ = ("_buf", "_n")

    def __init__(self, initial: Sequence[int] = ()) -> None:
        n = len(initial)
        self._buf = np.empty(max(64, 2 * n), dtype=np.int64)
        self._buf[:n] = initial
        self._n = n

    def __len__(self) -> int:
        return self._n

    def extend(self, slots: Sequence[int]) -> None:
        k = len(slots)
        need = self._n + k
        if need > self._buf.size:
            grown = np.empty(max(need, 2 * self._buf.size), dtype=np.int64)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n : need] = slots
        self._n = need

    def truncate(self, length: int) -> None:
        self._n = min(self._n, max(length, 0))

    def pop(self) -> int:
        if not self._n:
            raise IndexError("pop from an empty slot sequence")
        self._n -= 1
        return int(self._buf[self._n])

    def view(self) -> np.ndarray:
        """The slots so far (a view: valid until the next extend)."""
        return self._buf[: self._n]
