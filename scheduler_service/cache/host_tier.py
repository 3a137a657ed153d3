"""The host-memory tier under the radix tree (issue 31): KV that outlives GPU memory.

A radix node's KV lives on the GPU (``node.value``, GPU slot ids), in host memory
(``node.host``, host slot ids), or both. The scheduler owns the host slot index space exactly
as it owns the GPU one (a second :class:`SlotAllocator`); the model service only executes the
copies this tier queues (``KVCopy``: save GPU -> host, load host -> GPU), in queue order, at
the start of the next step it is sent (after the step's releases, before its forward pass).

Policy (``--host-tier-write``):
- ``write_back`` (default): a GPU leaf chosen for eviction is copied to the host (if it has no
  host copy yet) and keeps its place in the tree as a host-only node; a node that already has a
  host copy (it was loaded back, or re-evicted) costs no copy at all, because a token path's KV
  never changes. It copies exactly what would otherwise be recomputed, in the step whose
  allocation evicts it.
- ``write_through``: a request that leaves with its KV cached (``insert``: finished, or
  retracted) queues the nodes of its path that have no host copy, and their copies are queued
  at once up to the step's budget: at most ``budget`` tokens per step (oldest first; a longer
  node is split at the budget, so a burst of finishes never makes one step copy more than
  ``budget`` tokens), the rest in later steps. A later GPU eviction then finds the host copy
  there and only frees the GPU slots. A node
  evicted before its turn is saved as under write-back. Its costs: copies of KV the GPU tier
  never loses, and host room taken from host-only KV earlier (the host LRU makes the room).
  docs/radix.md has both measured.

The host tier has its own LRU eviction (always LRU: ``last_access``, the tree's logical clock).
Its candidates are nodes with a host copy that are either on the GPU too (the host copy is
dropped, the node stays) or host-only leaves (the node leaves the tree). Pinned nodes (a path
being loaded back right now) are skipped.

A step the model service refuses or fails may have run none, some or all of its copies, so
none counts as run: ``failed`` names the slots its copies (and later copies reading them) were
to write, from the batches ``take_copies`` keeps per step, and the tree drops the copies held in
them (``radix_host.undo_copies``).

Invariants (checked by ``integrity.check_host_integrity``):
- ``allocator.free_count + held == capacity`` where ``held`` is the host tokens of tree nodes
  (requests never own host slots and nothing is locked in host memory outside a load, so the
  tier's ``evictable + locked + owned`` is just ``held``);
- every host slot is in at most one node and never free; ``len(node.host) == len(node.key)``;
- every eligible node (above) has an entry in the heap; no node stays pinned between calls.

Pure bookkeeping: no torch, no protobuf (``KVCopy`` is a plain dataclass of the wire package).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixmesh_wire.step_ops import KVCopy
from scheduler_service.cache.allocator import SlotAllocator

WRITE_POLICIES = ("write_back", "write_through")
# Write-through: most tokens copied GPU -> host per step. On an H100 with the 8B model a token's
# KV is 128 KiB, so 2,048 tokens are 256 MiB, about 5 ms of PCIe at 50 GB/s: small against a
# prefill step, and a burst of finished requests spreads over steps instead of stalling one.
WRITE_THROUGH_TOKENS = 2048
# Copy batches of the last steps sent, kept until the step's result: a failed step's copies are
# undone then (``failed``). The scheduler has at most two steps in flight and handles a failure
# before building another, so the failed step and any step after it are among the last four.
SENT_KEPT = 4


@dataclass(slots=True)
class HostStats:
    """Monotonic counters of the host tier (metrics and GetStats)."""

    host_hit_tokens: int = 0  # matched tokens served from host memory (loaded back)
    saved_tokens: int = 0  # copied GPU -> host (write-back on eviction, and write-through)
    written_through_tokens: int = 0  # of saved_tokens, those copied by write-through
    loaded_tokens: int = 0  # copied host -> GPU
    host_evicted_tokens: int = 0  # host copies dropped by the host tier's own LRU
    lost_tokens: int = 0  # evicted from the GPU with no room on the host: recomputed if needed
    undone_tokens: int = 0  # copies of either tier dropped: the step carrying the copy failed
    copy_steps: int = 0  # steps that carried copies
    copy_ops: int = 0  # KVCopy ops sent (after merging neighbours)
    max_step_copy_tokens: int = 0  # most tokens (both directions) one step copied
    load_waits: int = 0  # admissions that joined a batch a step later, behind a load
    loading_requests: int = 0  # gauge: requests admitted loading in the last step built


def eligible(node: Any) -> bool:
    """Whether the host tier may drop ``node``'s host copy now."""
    return not node.dead and node.host is not None and (bool(node.value) or not node.children)


class HostTier:
    """Host slots, their LRU and the copy queue (see the module docstring).

    ``unlink(node)`` is the tree's removal of a host-only leaf, ``split(node, k)`` the tree's
    cut of a node's edge after ``k`` tokens returning the new upper node (the tree owns its
    structure; write-through splits a node longer than a step's budget).
    """

    def __init__(
        self,
        capacity: int,
        unlink: Callable[[Any], None],
        split: Callable[[Any, int], Any] | None = None,
        *,
        debug: bool = False,
        write: str = "write_back",
        budget: int = WRITE_THROUGH_TOKENS,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"host tier capacity must be > 0, got {capacity}")
        if write not in WRITE_POLICIES:
            raise ValueError(f"unknown host tier write policy {write!r}; one of {WRITE_POLICIES}")
        if write == "write_through" and (split is None or budget < 1):
            raise ValueError("write-through needs the tree's split and a budget >= 1")
        self.allocator = SlotAllocator(capacity, debug=debug)
        self.stats = HostStats()
        self._unlink = unlink
        self._split = split
        self._heap: list[tuple[int, int, Any]] = []
        self._seq = itertools.count()
        self._copies: list[KVCopy] = []
        self._sent: deque[tuple[int, list[KVCopy]]] = deque(maxlen=SENT_KEPT)  # (step, copies)
        # GPU slots loaded in the step being built (load-ahead: no row of that step may read
        # them; the next step may). Cleared when the step takes its copies.
        self.loading: set[int] = set()
        self.held = 0  # host tokens held by tree nodes
        self.write_through = write == "write_through"
        self._budget = self._left = budget  # _left: what the step being assembled may still take
        # Write-through queue: nodes to copy to the host, oldest first (an ordered set; entries
        # that died, left the GPU or got a host copy meanwhile are skipped when reached).
        self._pending: dict[Any, None] = {}

    @property
    def budget(self) -> int:
        """Write-through: most tokens copied GPU -> host per step."""
        return self._budget

    @budget.setter
    def budget(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"write-through budget must be >= 1, got {n}")
        self._budget = self._left = n

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    # -- LRU ----------------------------------------------------------------------------------
    def push(self, node: Any) -> None:
        """``node`` may have become eligible (or its time changed): give it a heap entry."""
        if eligible(node):
            heapq.heappush(self._heap, (node.last_access, next(self._seq), node))
            # Stale entries pile up (entries are invalidated lazily): rebuild when the heap
            # outgrows the host tokens (a bound on the nodes holding any), amortised O(1).
            if len(self._heap) > 2 * self.held + 256:
                self._rebuild()

    def _live(self) -> set[Any]:
        return {n for _, _, n in self._heap if eligible(n)}

    def _rebuild(self) -> None:
        heap = [(n.last_access, next(self._seq), n) for n in self._live()]
        heapq.heapify(heap)
        self._heap = heap

    def heap_nodes(self) -> set[int]:
        """ids of the nodes with a live entry (integrity checks)."""
        return {id(n) for n in self._live()}

    def evict(self, n: int) -> int:
        """Drop at least ``n`` host tokens, least recently used first; returns tokens freed."""
        heap = self._heap
        freed = 0
        skipped: list[Any] = []
        while freed < n and heap:
            t, _, node = heapq.heappop(heap)
            if not eligible(node):
                continue  # stale entry
            if node.last_access != t:  # used since it was pushed: its real place is later
                heapq.heappush(heap, (node.last_access, next(self._seq), node))
                continue
            if node.pinned:
                skipped.append(node)
                continue
            freed += self.drop(node)
            if not node.value:  # host-only leaf: it leaves the tree
                parent = node.parent
                self._unlink(node)
                if parent is not None:
                    self.push(parent)
        for node in skipped:
            self.push(node)
        self.stats.host_evicted_tokens += freed
        return freed

    def drop(self, node: Any) -> int:
        """Free ``node``'s host copy (the caller handles the tree); returns its tokens."""
        host = node.host
        if host is None:
            return 0
        self.allocator.free(host)
        node.host = None
        self.held -= len(host)
        return len(host)

    # -- copies -------------------------------------------------------------------------------
    def save(self, node: Any) -> bool:
        """Write-back: ``node`` is about to lose its GPU slots. True when its KV is (or will be,
        by a queued copy) in host memory; False when there is no room (the caller drops it)."""
        if node.host is not None:
            return True  # already there: a token path's KV never changes
        return self._to_host(node)

    def _to_host(self, node: Any) -> bool:
        """Give GPU-resident ``node`` host slots (the host LRU makes room) and queue the copy."""
        n = len(node.value)
        alloc = self.allocator
        if n > alloc.capacity:
            return False
        if n > alloc.free_count:
            self.evict(n - alloc.free_count)
        slots = alloc.alloc(n)
        if slots is None:
            return False
        node.host = slots
        self.held += n
        self._copies.append(KVCopy(True, list(node.value), slots))
        self.stats.saved_tokens += n
        self.push(node)
        return True

    # -- write-through ------------------------------------------------------------------------
    def written(self, path: list[Any]) -> None:
        """A request left with its KV in ``path`` (root first): queue the nodes without a host
        copy for write-through (no-op under write-back), and their copies now as far as this
        step's budget goes: queued before the next allocation can evict them, so that eviction
        only frees their GPU slots (queue order keeps the copy ahead of the slots' reuse)."""
        if self.write_through:
            pending = self._pending
            for node in path:
                if node.value and node.host is None:
                    pending[node] = None
            self._drain_pending()

    def split(self, lower: Any, upper: Any) -> None:
        """The tree cut ``upper`` off ``lower``'s edge: it may be eligible, and it is queued
        for write-through when ``lower`` is."""
        self.push(upper)
        if lower in self._pending:
            self._pending[upper] = None

    def _drain_pending(self) -> None:
        """Queue write-through copies up to this step's budget (after every copy queued so far:
        they read or free slots first)."""
        pending = self._pending
        left = self._left
        while pending and left > 0:
            node = next(iter(pending))
            del pending[node]
            if node.dead or not node.value or node.host is not None:
                continue  # evicted (saved by write-back, or lost), or copied already
            if len(node.value) > left:
                assert self._split is not None
                upper = self._split(node, left)  # the rest waits for the next step
                pending[node] = None
                node = upper
            if not self._to_host(node):
                break  # no host room this step
            self.stats.written_through_tokens += len(node.value)
            left -= len(node.value)
        self._left = left

    @property
    def pending_write_through(self) -> int:
        """Nodes queued for write-through (some may be stale)."""
        return len(self._pending)

    def load(self, node: Any, gpu_slots: list[int]) -> None:
        """Queue the copy of host-only ``node`` into ``gpu_slots`` (it keeps its host copy)."""
        self._copies.append(KVCopy(False, list(node.host), list(gpu_slots)))
        self.loading.update(gpu_slots)
        self.stats.loaded_tokens += len(gpu_slots)

    def take_copies(self, step_id: int | None = None) -> list[KVCopy]:
        """The queued copies, oldest first, for the step about to be sent. Neighbours of the
        same direction are merged (fewer, larger copies) unless a destination repeats: a host
        slot freed and reused inside one queue must be written in order. Under write-through
        this step's share of the queue comes last, and the next step's budget starts. With
        ``step_id`` (the step builder) they are kept until that step's result (``failed``)."""
        if self._pending:
            self._drain_pending()
        self._left = self.budget
        out: list[KVCopy] = []
        src: list[int] = []
        dst: list[int] = []
        dsts: set[int] = set()
        to_host = False
        for c in self._copies:
            if src and (c.to_host != to_host or not dsts.isdisjoint(c.dst)):
                out.append(KVCopy(to_host, src, dst))
                src, dst, dsts = [], [], set()
            to_host = c.to_host
            src.extend(c.src)  # fresh lists: the queued ops stay as they were
            dst.extend(c.dst)
            dsts.update(c.dst)
        if src:
            out.append(KVCopy(to_host, src, dst))
        self._copies = []
        self.loading = set()
        if out:
            if step_id is not None:
                self._sent.append((step_id, out))
            st = self.stats
            st.copy_steps += 1
            st.copy_ops += len(out)
            tokens = sum(len(c.src) for c in out)
            if tokens > st.max_step_copy_tokens:
                st.max_step_copy_tokens = tokens
        return out

    @property
    def queued(self) -> int:
        return len(self._copies)

    def failed(self, step_id: int) -> tuple[set[int], set[int]]:
        """Step ``step_id`` failed at the model service: treat none of its copies as run (a
        step its checks refuse runs none; one that fails later may have run some, or all).
        Returns the (GPU, host) slots whose content is not what the tree assumes: that step's
        destinations, and the destinations of every later copy (the steps sent since, then the
        queue) that reads one of them; a later copy that writes one from a good source makes
        it good again. Steps before ``step_id`` are forgotten: their results came, so their
        copies ran."""
        sent = self._sent
        while sent and sent[0][0] < step_id:
            sent.popleft()
        if not sent or sent[0][0] != step_id:
            return set(), set()  # the step carried no copies
        gpu: set[int] = set()
        host: set[int] = set()
        for c in sent.popleft()[1]:
            (host if c.to_host else gpu).update(c.dst)
        for c in [c for _, cs in sent for c in cs] + self._copies:
            bad_src, bad_dst = (gpu, host) if c.to_host else (host, gpu)
            for s, d in zip(c.src, c.dst, strict=True):
                if s in bad_src:
                    bad_dst.add(d)
                else:
                    bad_dst.discard(d)
        return gpu, host

    def reset(self) -> None:
        """The model service lost its host pool with its GPU pool: everything is free."""
        self.allocator.reset()
        self._heap = []
        self._copies = []
        self._sent.clear()
        self.loading = set()
        self._pending = {}
        self.held = 0

    def forget_pending(self) -> None:
        """Drop the write-through queue (a flush saves nothing)."""
        self._pending = {}
