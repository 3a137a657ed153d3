"""What the radix cache holds, as the chained block hashes front doors route on, and what
changed since the last drain (scale-out: the scheduler session's ``CacheEvents``).

A :class:`CachePublisher` is the radix tree's ``CacheObserver``. Block ``i`` (hash
``block_hashes(keys)[i]``, ``radixmesh_wire.cache_blocks``) is held exactly while the tree
holds a root path of depth >= ``(i + 1) * BLOCK_TOKENS`` starting with those keys. Each block
is attributed to the node whose edge holds its last key, so:

- a new leaf covering depths ``(start, end]`` adds blocks ``start // B .. end // B - 1``,
  hashed incrementally from the last block of the nearest ancestor that has one (the walk up
  passes fewer than ``B`` tokens: every node it skips holds no block end);
- a split at depth ``d`` hands the blocks ending at depth ``<= d`` to the new upper node;
- an evicted leaf removes exactly its own blocks (its ancestors still hold theirs);
- a reset drops every tree block.

Invariant (``check_integrity``): for every node, its entry is ``(depth above its edge, the
hashes of the blocks ending on its edge)`` computed from scratch from its root path, no other
entry exists, ``_tree`` is the union of the entries, every hold count is positive, and the
pending changes are consistent with the published set (``added`` held, ``removed`` not).

Provisional holds (`hold` / `release`): the blocks of a prompt a request brought are published
from its submission until it ends, as well as the tree's. A routed prefix is then visible to
every front door within milliseconds, not only after its prefill has run and been inserted:
requests of one new prefix that reach several front doors at once follow the first one.
The published set is ``tree blocks | held blocks`` (holds are counted: prompts share blocks);
a change of either part is published only where it changes that union.

Changes accumulate as the *net* difference from the state last drained: a block added and
evicted between two drains appears in neither list. So a new subscriber's snapshot must be that
same state (what every other subscriber holds until the next drain), not the current set: the
next drain then brings everyone to the current set (a block added and evicted in between would
otherwise stay in the new subscriber's set forever).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from radixmesh_wire.cache_blocks import BLOCK_TOKENS, block_hashes

_B = BLOCK_TOKENS


def _net(gained: set[int], undone: set[int], hashes: list[int]) -> None:
    """Record ``hashes`` in ``gained`` (pending adds, or removes), except those that undo a
    pending change of the other kind since the last drain: they drop out of ``undone``."""
    back = undone.intersection(hashes) if undone else None
    if back:
        undone.difference_update(back)
        gained.update(h for h in hashes if h not in back)
    else:
        gained.update(hashes)


@dataclass(frozen=True, slots=True)
class CacheDelta:
    """One ``CacheEvents`` message: with ``reset``, ``added`` is the whole held set."""

    reset: bool
    added: list[int]
    removed: list[int]


class CachePublisher:
    """Mirrors a radix tree's held blocks (``CacheObserver``) and accumulates their changes."""

    __slots__ = ("_blocks", "_tree", "_holds", "_added", "_removed", "_reset")

    def __init__(self) -> None:
        # node -> (depth above its edge, hashes of the blocks whose last key is on its edge);
        # only nodes holding at least one block end have an entry.
        self._blocks: dict[Any, tuple[int, list[int]]] = {}
        self._tree: set[int] = set()  # every hash in _blocks (a block is on one root path)
        self._holds: dict[int, int] = {}  # provisional holds: hash -> live requests holding it
        self._added: set[int] = set()
        self._removed: set[int] = set()
        self._reset = False

    # -- CacheObserver ----------------------------------------------------------------------
    def added(self, leaf: Any, keys: list[int], start: int) -> None:
        first, stop = start // _B, len(keys) // _B
        if stop <= first:
            return  # no block ends on this edge
        if first == 0:
            hashes = block_hashes(keys, 0)
        else:
            prev = self._last_hash_above(leaf)
            # Not found only if the mirror were broken: hash the whole path instead of
            # publishing a wrong chain.
            hashes = (
                block_hashes(keys, first, prev)
                if prev is not None
                else block_hashes(keys)[first:stop]
            )
        self._blocks[leaf] = (start, hashes)
        self._tree.update(hashes)
        holds = self._holds
        _net(self._added, self._removed, [h for h in hashes if h not in holds])

    def _last_hash_above(self, node: Any) -> int | None:
        blocks = self._blocks
        p = node.parent
        while p is not None:
            entry = blocks.get(p)
            if entry is not None:
                return entry[1][-1]
            p = p.parent
        return None

    def split(self, lower: Any, upper: Any, k: int) -> None:
        entry = self._blocks.get(lower)
        if entry is None:
            return  # neither half holds a block end
        start, hashes = entry
        cut = (start + k) // _B - start // _B  # blocks ending within the first k keys
        if cut:
            self._blocks[upper] = (start, hashes[:cut])
        if cut == len(hashes):
            del self._blocks[lower]
        else:
            self._blocks[lower] = (start + k, hashes[cut:])

    def evicted(self, node: Any) -> None:
        entry = self._blocks.pop(node, None)
        if entry is not None:
            self._tree.difference_update(entry[1])
            holds = self._holds
            _net(self._removed, self._added, [h for h in entry[1] if h not in holds])

    def reset(self) -> None:
        """The tree is gone; provisional holds stay (their requests are still live)."""
        self._blocks.clear()
        self._tree.clear()
        self._added = set(self._holds)
        self._removed.clear()
        self._reset = True

    # -- provisional holds ----------------------------------------------------------------------
    def hold(self, hashes: Iterable[int]) -> None:
        """A live request's prompt blocks: published until the matching `release`."""
        holds, tree = self._holds, self._tree
        new = []
        for h in hashes:
            n = holds.get(h, 0)
            holds[h] = n + 1
            if n == 0 and h not in tree:
                new.append(h)
        if new:
            _net(self._added, self._removed, new)

    def release(self, hashes: Iterable[int]) -> None:
        """Undo one `hold` of the same hashes (its request ended)."""
        holds, tree = self._holds, self._tree
        gone = []
        for h in hashes:
            n = holds.get(h, 0) - 1
            if n > 0:
                holds[h] = n
                continue
            holds.pop(h, None)
            if h not in tree:
                gone.append(h)
        if gone:
            _net(self._removed, self._added, gone)

    # -- publishing -------------------------------------------------------------------------
    @property
    def block_count(self) -> int:
        """Blocks published now: the tree's and the provisional ones."""
        return len(self._tree) + sum(1 for h in self._holds if h not in self._tree)

    def held(self) -> set[int]:
        return self._tree | self._holds.keys()

    def snapshot(self) -> CacheDelta:
        """A new subscriber's first message: the set as of the last drain, as a reset. Apply
        every later drain on top of it (this does not drain)."""
        held = self.held()
        if not self._reset:  # with a reset pending, the next drain replaces everything anyway
            held = (held - self._added) | self._removed
        return CacheDelta(True, sorted(held), [])

    def drain(self) -> CacheDelta | None:
        """The net change since the previous drain (``None``: nothing changed)."""
        if not (self._reset or self._added or self._removed):
            return None
        delta = CacheDelta(self._reset, sorted(self._added), sorted(self._removed))
        self._added, self._removed, self._reset = set(), set(), False
        return delta

    # -- invariant ----------------------------------------------------------------------------
    def check_integrity(self, paths: Iterable[tuple[Any, int, list[int]]]) -> None:
        """Raise ``AssertionError`` unless the mirror equals the tree's blocks computed from
        scratch. ``paths``: every node with its depth above its edge and its root path's keys
        (``RadixCache.debug_paths()``)."""

        def fail(msg: str) -> None:
            raise AssertionError(f"cache publisher integrity: {msg}")

        seen = 0
        for node, start, path in paths:
            want = block_hashes(path)[start // _B :]
            entry = self._blocks.get(node)
            if not want:
                if entry is not None:
                    fail(f"{node!r} holds no block end but has entry {entry}")
                continue
            seen += 1
            if entry != (start, want):
                fail(f"{node!r} at depth {start}: entry {entry}, tree says {(start, want)}")
        if seen != len(self._blocks):
            fail(f"{len(self._blocks) - seen} entries for nodes no longer in the tree")
        tree = {h for _, hashes in self._blocks.values() for h in hashes}
        if tree != self._tree:
            fail(f"tree hash set off by {len(tree ^ self._tree)} hashes")
        if any(n <= 0 for n in self._holds.values()):
            fail("a provisional hold with no holder")
        held = self.held()
        if self._added - held:
            fail(f"pending adds not held: {sorted(self._added - held)[:5]}")
        if self._removed & held:
            fail(f"pending removes still held: {sorted(self._removed & held)[:5]}")
        if self._reset and self._removed:
            fail("removes pending after a reset (the reset already dropped everything)")
