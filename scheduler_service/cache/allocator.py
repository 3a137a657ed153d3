"""KV slot allocator: the scheduler's view of the model service's KV pool index space.

The model service owns one KV tensor indexed by token slot (page size 1); the scheduler decides
which slot holds which token. This module only hands out and takes back slot ids
``0 .. capacity - 1``.

Invariants:
- a slot is either free (in the free list exactly once) or held by someone else (the prefix
  cache or a request); the allocator never tracks *who* holds it;
- ``alloc(n)`` is all-or-nothing: it returns exactly ``n`` slots or ``None`` and changes nothing;
- with ``debug=True`` a set mirrors the free list so double frees and out-of-range ids raise
  ``ValueError`` at the offending call instead of corrupting the pool silently.
"""

from __future__ import annotations

from collections.abc import Iterable


class SlotAllocator:
    """LIFO free list of slot ids.

    LIFO keeps recently freed slots hot and makes ``alloc``/``free`` one C-level slice or
    extend each, which matters: the scheduler allocates for every decode step.
    """

    __slots__ = ("_capacity", "_free", "_free_set", "_debug", "_track_freed", "_freed")

    def __init__(self, capacity: int, *, debug: bool = False, track_freed: bool = False) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._debug = debug
        self._track_freed = track_freed
        # Reversed so the first allocations hand out 0, 1, 2, ... (readable logs and tests).
        self._free: list[int] = list(range(capacity - 1, -1, -1))
        self._free_set: set[int] | None = set(self._free) if debug else None
        self._freed: list[int] = []

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def debug(self) -> bool:
        return self._debug

    def alloc(self, n: int) -> list[int] | None:
        """Take ``n`` free slots, or return ``None`` (taking nothing) if fewer are free."""
        if n <= 0:
            if n < 0:
                raise ValueError(f"cannot allocate {n} slots")
            return []
        free = self._free
        if len(free) < n:
            return None
        out = free[-n:]
        del free[-n:]
        out.reverse()
        if self._free_set is not None:
            self._free_set.difference_update(out)
        return out

    def free(self, slots: Iterable[int]) -> None:
        """Return slots to the pool. The caller must hold them (debug mode checks)."""
        if not isinstance(slots, list):
            slots = list(slots)
        if not slots:
            return
        fs = self._free_set
        if fs is not None:
            cap = self._capacity
            seen: set[int] = set()
            for s in slots:
                if not 0 <= s < cap:
                    raise ValueError(f"slot {s} out of range 0..{cap - 1}")
                if s in fs or s in seen:
                    raise ValueError(f"double free of slot {s}")
                seen.add(s)
            fs.update(slots)
        self._free.extend(slots)
        if self._track_freed:
            self._freed.extend(slots)

    def drain_freed(self) -> list[int]:
        """Slots freed since the previous call (only recorded with ``track_freed=True``).

        The scheduler forwards them to the model service, which can poison them with NaN in a
        debug mode so that any later read of a freed slot shows up in the logits.
        """
        out = self._freed
        self._freed = []
        return out

    def reset(self) -> None:
        """Every slot free again (the model service lost its KV pool)."""
        self._free = list(range(self._capacity - 1, -1, -1))
        if self._free_set is not None:
            self._free_set = set(self._free)
        # Whatever was recorded refers to a pool that no longer exists.
        self._freed = []

    def free_list(self) -> list[int]:
        """A copy of the free slot ids (for integrity checks and tests; O(capacity))."""
        return list(self._free)

    def is_free(self, slot: int) -> bool:
        """Whether ``slot`` is free. O(1) in debug mode, O(capacity) otherwise."""
        if self._free_set is not None:
            return slot in self._free_set
        return slot in self._free
