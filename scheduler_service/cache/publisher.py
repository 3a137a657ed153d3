"""What the radix cache holds, as the chained block hashes front doors route on, with the tier
each block lives in, and what changed since the last drain (scale-out: the scheduler session's
``CacheEvents``).

A :class:`CachePublisher` is the radix tree's ``CacheObserver``. Block ``i`` (hash
``block_hashes(keys)[i]``, ``radixmesh_wire.cache_blocks``) is held exactly while the tree
holds a root path of depth >= ``(i + 1) * BLOCK_TOKENS`` starting with those keys. Each block
is attributed to the node whose edge holds its last key, and lives in that node's tier: on the
GPU while the node has GPU slots, in host memory while it is host-only (issue 31: evicted from
the GPU and saved to the host tier). So:

- a new leaf covering depths ``(start, end]`` adds GPU blocks ``start // B .. end // B - 1``,
  hashed incrementally from the last block of the nearest ancestor that has one (the walk up
  passes fewer than ``B`` tokens: every node it skips holds no block end);
- a split at depth ``d`` hands the blocks ending at depth ``<= d`` to the new upper node (the
  two halves are in the same tier);
- an offloaded node (GPU -> host) moves its blocks to the host tier; a host-only node brought
  back (loaded, or recomputed by a request) moves them back to the GPU, hashes unchanged;
- a node leaving the tree (evicted with no room on the host, or dropped by the host tier's own
  LRU) removes exactly its own blocks (its ancestors still hold theirs);
- a reset drops every tree block.

Provisional holds (`hold` / `release`): the blocks of a prompt a request brought are published
from its submission until it ends, as well as the tree's. A routed prefix is then visible to
every front door within milliseconds, not only after its prefill has run and been inserted:
requests of one new prefix that reach several front doors at once follow the first one. A held
block is published as GPU-resident (its request loads or computes it on admission).

The published state of a hash: ``GPU`` if a GPU node or a hold has it, else ``HOST`` if a
host-only node has it, else absent. ``CacheDelta`` lists every hash whose state changed since
the last drain by its new state: ``added`` (now on the GPU: new, or loaded back), ``host``
(now host-only: new to the set, or moved off the GPU) and ``removed`` (in neither).

Changes are *net* differences from the state last drained: every change first records the
hash's state as of the last drain (``_prev``, kept only for hashes touched since), and a drain
lists the touched hashes whose state now differs. A block added and evicted between two drains
appears in no list. So a new subscriber's snapshot must be that same drained state (what every
other subscriber holds until the next drain), not the current one: the next drain then brings
everyone to the current state (a block added and evicted in between would otherwise stay in the
new subscriber's set forever).

Invariant (``check_integrity``): for every GPU node, its ``_gpu`` entry (and for every host-only
node, its ``_host`` entry) is ``(depth above its edge, the hashes of the blocks ending on its
edge)`` computed from scratch from its root path, no other entry exists, ``_gpu_tree`` /
``_host_tree`` are the unions of the entries, every hold count is positive, and nothing is
recorded as changed while a reset is pending (the reset's drain sends everything).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from radixmesh_wire.cache_blocks import BLOCK_TOKENS, block_hashes

_B = BLOCK_TOKENS
ABSENT, HOST, GPU = 0, 1, 2  # published states of a hash


@dataclass(frozen=True, slots=True)
class CacheDelta:
    """One ``CacheEvents`` message: blocks now on the GPU (``added``), now in host memory only
    (``host``), now in neither (``removed``). With ``reset``, ``added`` and ``host`` are the
    whole published state."""

    reset: bool
    added: list[int]
    removed: list[int]
    host: list[int] = field(default_factory=list)


Entry = tuple[int, list[int]]  # (depth above a node's edge, hashes of its blocks)


class CachePublisher:
    """Mirrors a radix tree's held blocks by tier (``CacheObserver``) and accumulates their
    changes."""

    __slots__ = ("_gpu", "_host", "_gpu_tree", "_host_tree", "_holds", "_prev", "_reset")

    def __init__(self) -> None:
        # node -> Entry; only nodes holding at least one block end have one, in the map of
        # the node's tier.
        self._gpu: dict[Any, Entry] = {}
        self._host: dict[Any, Entry] = {}
        self._gpu_tree: set[int] = set()  # every hash in _gpu (a block is on one root path)
        self._host_tree: set[int] = set()  # every hash in _host
        self._holds: dict[int, int] = {}  # provisional holds: hash -> live requests holding it
        self._prev: dict[int, int] = {}  # touched since the last drain -> its state then
        self._reset = False

    def _touch(self, hashes: Iterable[int]) -> None:
        """Record the drained state of ``hashes`` before they change (first touch only)."""
        if self._reset:
            return  # the reset's drain sends the whole state
        prev, gpu, holds, host = self._prev, self._gpu_tree, self._holds, self._host_tree
        for h in hashes:
            if h not in prev:
                prev[h] = GPU if (h in gpu or h in holds) else (HOST if h in host else ABSENT)

    # -- CacheObserver ----------------------------------------------------------------------
    def added(self, leaf: Any, keys: list[int], start: int) -> None:
        back = self._host.pop(leaf, None)
        if back is not None:  # a host-only node is on the GPU again: same blocks
            self._touch(back[1])
            self._host_tree.difference_update(back[1])
            self._gpu[leaf] = back
            self._gpu_tree.update(back[1])
            return
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
        self._touch(hashes)
        self._gpu[leaf] = (start, hashes)
        self._gpu_tree.update(hashes)

    def _last_hash_above(self, node: Any) -> int | None:
        gpu, host = self._gpu, self._host
        p = node.parent
        while p is not None:
            entry = gpu.get(p) or host.get(p)
            if entry is not None:
                return entry[1][-1]
            p = p.parent
        return None

    def split(self, lower: Any, upper: Any, k: int) -> None:
        tier = self._gpu if lower in self._gpu else self._host
        entry = tier.get(lower)
        if entry is None:
            return  # neither half holds a block end
        start, hashes = entry
        cut = (start + k) // _B - start // _B  # blocks ending within the first k keys
        if cut:
            tier[upper] = (start, hashes[:cut])
        if cut == len(hashes):
            del tier[lower]
        else:
            tier[lower] = (start + k, hashes[cut:])

    def offloaded(self, node: Any) -> None:
        """``node`` left the GPU but stays in the tree, host-only: its blocks are host blocks."""
        entry = self._gpu.pop(node, None)
        if entry is not None:
            self._touch(entry[1])
            self._gpu_tree.difference_update(entry[1])
            self._host[node] = entry
            self._host_tree.update(entry[1])

    def evicted(self, node: Any) -> None:
        """``node`` left the tree, from either tier."""
        entry = self._gpu.pop(node, None)
        tree = self._gpu_tree
        if entry is None:
            entry = self._host.pop(node, None)
            tree = self._host_tree
        if entry is not None:
            self._touch(entry[1])
            tree.difference_update(entry[1])

    def reset(self) -> None:
        """The tree is gone; provisional holds stay (their requests are still live)."""
        self._gpu.clear()
        self._host.clear()
        self._gpu_tree.clear()
        self._host_tree.clear()
        self._prev.clear()
        self._reset = True

    # -- provisional holds ----------------------------------------------------------------------
    def hold(self, hashes: Iterable[int]) -> None:
        """A live request's prompt blocks: published until the matching `release`."""
        holds = self._holds
        for h in hashes:
            n = holds.get(h, 0)
            if n == 0:
                self._touch((h,))
            holds[h] = n + 1

    def release(self, hashes: Iterable[int]) -> None:
        """Undo one `hold` of the same hashes (its request ended)."""
        holds = self._holds
        for h in hashes:
            n = holds.get(h, 0) - 1
            if n > 0:
                holds[h] = n
                continue
            self._touch((h,))
            holds.pop(h, None)

    # -- publishing -------------------------------------------------------------------------
    @property
    def block_count(self) -> int:
        """Blocks published now, in either tier: the tree's and the provisional ones."""
        gpu = self._gpu_tree
        return len(gpu) + sum(1 for h in self._holds if h not in gpu) + self.host_block_count

    @property
    def host_block_count(self) -> int:
        """Blocks published now as host-resident only."""
        gpu, holds = self._gpu_tree, self._holds
        return sum(1 for h in self._host_tree if h not in gpu and h not in holds)

    def held(self) -> set[int]:
        """Every hash published now, in either tier."""
        return self._gpu_tree | self._host_tree | self._holds.keys()

    def gpu_held(self) -> set[int]:
        return self._gpu_tree | self._holds.keys()

    def host_held(self) -> set[int]:
        return self._host_tree - self._gpu_tree - self._holds.keys()

    def snapshot(self) -> CacheDelta:
        """A new subscriber's first message: the state as of the last drain, as a reset. Apply
        every later drain on top of it (this does not drain)."""
        gpu, host = self.gpu_held(), self.host_held()
        # With a reset pending, the next drain replaces everything anyway.
        for h, old in self._prev.items():
            gpu.discard(h)
            host.discard(h)
            if old == GPU:
                gpu.add(h)
            elif old == HOST:
                host.add(h)
        return CacheDelta(True, sorted(gpu), [], sorted(host))

    def drain(self) -> CacheDelta | None:
        """The net change since the previous drain (``None``: nothing changed)."""
        if self._reset:
            self._reset = False
            return CacheDelta(True, sorted(self.gpu_held()), [], sorted(self.host_held()))
        if not self._prev:
            return None
        out: tuple[list[int], list[int], list[int]] = ([], [], [])  # by state: ABSENT, HOST, GPU
        gpu, holds, on_host = self._gpu_tree, self._holds, self._host_tree
        for h, old in self._prev.items():  # its published state now (as in _touch)
            now = GPU if (h in gpu or h in holds) else (HOST if h in on_host else ABSENT)
            if now != old:
                out[now].append(h)
        self._prev = {}
        removed, host, added = out
        if not (removed or host or added):
            return None
        return CacheDelta(False, sorted(added), sorted(removed), sorted(host))

    # -- invariant ----------------------------------------------------------------------------
    def check_integrity(
        self,
        paths: Iterable[tuple[Any, int, list[int]]],
        host_paths: Iterable[tuple[Any, int, list[int]]] = (),
    ) -> None:
        """Raise ``AssertionError`` unless the mirror equals the tree's blocks computed from
        scratch. ``paths`` / ``host_paths``: every GPU / host-only node with its depth above its
        edge and its root path's keys (``RadixCache.debug_paths()`` / ``debug_host_paths()``)."""

        def fail(msg: str) -> None:
            raise AssertionError(f"cache publisher integrity: {msg}")

        for name, entries, tree, nodes in (
            ("GPU", self._gpu, self._gpu_tree, paths),
            ("host", self._host, self._host_tree, host_paths),
        ):
            seen = 0
            for node, start, path in nodes:
                want = block_hashes(path)[start // _B :]
                entry = entries.get(node)
                if not want:
                    if entry is not None:
                        fail(f"{name} {node!r} holds no block end but has entry {entry}")
                    continue
                seen += 1
                if entry != (start, want):
                    fail(f"{name} {node!r} at depth {start}: entry {entry}, tree: {start, want}")
            if seen != len(entries):
                fail(f"{len(entries) - seen} {name} entries for nodes not in that tier")
            union = {h for _, hashes in entries.values() for h in hashes}
            if union != tree:
                fail(f"{name} hash set off by {len(union ^ tree)} hashes")
        if any(n <= 0 for n in self._holds.values()):
            fail("a provisional hold with no holder")
        if self._reset and self._prev:
            fail("changes recorded while a reset is pending (its drain sends everything)")
