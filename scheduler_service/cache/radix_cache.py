"""RadixAttention: a radix tree from token ids to KV slot ids (page size 1), LRU over leaves.

SGLang paper section 3: edges hold token runs, a node splits where a new sequence diverges
mid-edge, running requests lock the path they use, and eviction removes least-recently-used
unlocked *leaves* first so shared ancestors live longest (a parent that becomes an unlocked leaf
is then a candidate itself). Cache and running requests share one slot pool.

Eviction order (``eviction``): ``lru`` or ``lfu``, over unlocked GPU leaves (``radix_evict``).

Protection (``protect_s`` > 0): every node on an inserted path (a finished, retracted or aborted
request, a prefill chunk) is *protected* for ``protect_s`` seconds, and ``protected_size`` (its
unlocked tokens) is left out of the admission budget while other work runs (prefill_adder): a
program or chat client sends its follow-up call milliseconds after the previous answer, and
without this a request admitted in that gap evicts exactly the context the follow-up extends
(the cyclic-LRU pathology of many concurrent sessions). Eviction order ignores it
(``radix_evict`` says why).

Invariants (``check_integrity`` verifies all of them):
- every non-root node has a non-empty edge, ``len(key) == len(value)``, and is stored in its
  parent's ``children`` under ``key[0]``;
- ``lock_ref(n) == direct(n) + sum(lock_ref(c) for c in children(n))`` where ``direct`` counts
  ``lock(n)`` calls not yet undone; hence a locked node's ancestors are all locked and an
  unlocked node's whole subtree is unlocked (so it can be evicted leaf by leaf);
- ``evictable_size`` / ``locked_size`` are the token counts of nodes with ``lock_ref == 0`` /
  ``> 0``; ``allocator.free_count + evictable + locked + request_owned == capacity``;
- a tree slot is never free and appears once in the tree;
- every unlocked leaf has a valid entry in the eviction heap (entries are invalidated lazily);
- ``protect_until(parent) >= protect_until(child)`` (inserts stamp whole paths), so the
  protected nodes form a subtree containing the root, and ``evictable - protected_size`` tokens
  can be evicted leaf-first without touching a protected node.

Observer (``observer``, ``--cache-events``): told of every new leaf, split, node leaving the
tree, node moving between the tiers (offloaded to the host, brought back to the GPU) and reset
(``prefix_cache.CacheObserver``), one call per structural change; with none set the hot paths
pay one ``is None`` test per change and nothing else.

A handle returned by ``match_prefix``/``insert`` keeps meaning "the path ending at this token
position": splitting always creates the *upper* half as a new node, so existing handles (and
their locks) stay on the lower half, whose path end is unchanged.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from time import monotonic, perf_counter
from typing import Any

from scheduler_service.cache import integrity, radix_evict, radix_host, radix_insert, radix_walk
from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.host_tier import HostTier
from scheduler_service.cache.prefix_cache import (
    EVICTION_POLICIES,
    CacheObserver,
    CacheStats,
    MatchResult,
)
from scheduler_service.cache.radix_node import (
    RadixNode,
    as_list,
    common_len,
    gpu_leaf,
    lfu_key,
    lru_key,
)


class RadixCache:
    """Radix tree prefix cache implementing :class:`~.prefix_cache.PrefixCache`.

    LRU time is a logical clock (one tick per match/insert), so ordering is exact and tests are
    deterministic; every node on an accessed path gets the same tick, and a parent is always at
    least as recent as any of its children. Protection uses wall time from ``clock``
    (injectable for tests).

    One class, its methods in modules by concern: this one holds the state, the sizes, match,
    locks and the tree's structural changes; ``radix_insert`` caching a request's KV,
    ``radix_evict`` the GPU-tier eviction, ``radix_host`` the host-tier paths and
    ``radix_walk`` the whole-tree walks. Their functions take the cache first and are bound in
    the class body (``insert = radix_insert.insert``): call sites stay methods, the hot paths
    pay no wrapper call, and this class remains the one owner of every field they touch.
    """

    def __init__(
        self,
        allocator: SlotAllocator,
        *,
        eviction: str = "lru",
        protect_s: float = 0.0,
        clock: Callable[[], float] = monotonic,
        observer: CacheObserver | None = None,
        host_capacity: int = 0,
        host_write: str = "write_back",
    ) -> None:
        if eviction not in EVICTION_POLICIES:
            raise ValueError(f"unknown eviction {eviction!r}; expected one of {EVICTION_POLICIES}")
        if protect_s < 0:
            raise ValueError("protect_s must be >= 0")
        self.allocator = allocator
        self.stats = CacheStats()
        self.eviction = eviction
        self.protect_s = protect_s
        self._now = clock
        self._key: Callable[[RadixNode], Any] = lfu_key if eviction == "lfu" else lru_key
        self._clock = 0
        self._seq = itertools.count()  # heap tie-breaker: entries never compare nodes
        self._root = RadixNode([], [], None, 0)
        # (eviction key at push time, seq, node); stale entries are skipped when popped.
        self._heap: list[tuple[object, int, RadixNode]] = []
        # Nodes stamped by recent inserts (an ordered set; expired ones pruned lazily).
        self._protected: dict[RadixNode, None] = {}
        self._evictable = 0
        self._locked = 0
        self._nodes = 0  # non-root nodes in the tree
        self.observer = observer
        # The host-memory tier (--host-kv-tokens > 0): evicted KV is saved there, not dropped.
        self.host: HostTier | None = (
            HostTier(
                host_capacity, self._unlink, self._split, debug=allocator.debug, write=host_write
            )
            if host_capacity
            else None
        )
        self._flushing = False  # flush(): eviction drops KV instead of saving it to the host

    # -- sizes --------------------------------------------------------------------------------
    @property
    def evictable_size(self) -> int:
        return self._evictable

    @property
    def locked_size(self) -> int:
        return self._locked

    @property
    def free_size(self) -> int:
        return self.allocator.free_count

    def total_cached(self) -> int:
        return self._evictable + self._locked

    @property
    def protected_size(self) -> int:
        """Evictable tokens still under insert protection (0 with ``protect_s == 0``). Timed
        as bookkeeping: admission asks it for every candidate."""
        prot = self._protected
        if not prot:
            return 0
        t0 = perf_counter()
        now = self._now()
        total = 0
        expired = []
        for node in prot:
            if node.dead or node.protect_until <= now:
                expired.append(node)
            elif node.lock_ref == 0 and node.value:
                total += len(node.key)
        for node in expired:
            del prot[node]
        self.stats.bookkeeping_seconds += perf_counter() - t0
        return total

    @property
    def root(self) -> object:
        return self._root

    # -- match --------------------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int], max_len: int | None = None) -> MatchResult:
        t0 = perf_counter()
        toks = as_list(tokens)
        n = len(toks)
        if max_len is not None and max_len < n:
            n = max(max_len, 0)
        self._clock += 1
        now = self._clock
        node = self._root
        slots: list[int] = []
        pos = 0
        host_len = 0
        host_node: RadixNode | None = None
        while pos < n:
            child = node.children.get(toks[pos])
            if child is None:
                break
            if not child.value:  # host-only: the GPU part of the match ends here
                if self.host is not None:
                    host_len, host_node = self._match_host(node, toks, pos, n, now)
                break
            key = child.key
            end = pos + len(key)
            if end <= n and key == toks[pos:end]:
                slots += child.value
                child.last_access = now
                node = child
                pos = end
                continue
            # The match ends inside this edge: split so the handle covers exactly the match.
            k = common_len(key, toks, pos, min(end, n))
            node = self._split(child, k)
            node.last_access = now
            slots += node.value
            pos += k
            break
        if node is not self._root and node.lock_ref == 0 and gpu_leaf(node):
            self._push(node)  # its LRU time changed
        st = self.stats
        st.match_calls += 1
        st.matched_tokens += pos
        st.bookkeeping_seconds += perf_counter() - t0
        return MatchResult(slots, node, host_len, host_node)

    def _split(self, child: RadixNode, k: int) -> RadixNode:
        """Cut ``child``'s edge after ``k`` tokens; the new upper node is returned."""
        assert 0 < k < len(child.key)
        parent = child.parent
        assert parent is not None
        upper = RadixNode(child.key[:k], child.value[:k], parent, child.last_access)
        # Every lock through child also passes through upper; none is taken on upper itself.
        upper.lock_ref = child.lock_ref
        upper.uses = child.uses
        upper.protect_until = child.protect_until
        if upper.protect_until:
            self._protected[upper] = None
        if child.host is not None:
            upper.host = child.host[:k]
            child.host = child.host[k:]
            upper.pinned = child.pinned
        child.key = child.key[k:]
        child.value = child.value[k:]
        child.parent = upper
        upper.children[child.key[0]] = child
        parent.children[upper.key[0]] = upper
        self._nodes += 1
        if self.observer is not None:
            self.observer.split(child, upper, k)
        if self.host is not None:
            self.host.split(child, upper)
        return upper

    # -- lock ---------------------------------------------------------------------------------
    def _node(self, node: object) -> RadixNode:
        if not isinstance(node, RadixNode):
            raise TypeError(f"not a radix cache node: {node!r}")
        return node

    def lock(self, node: object) -> None:
        t0 = perf_counter()
        n = self._node(node)
        root = self._root
        if n is not root:
            if n.dead or not n.value:
                raise ValueError(f"lock of a stale or host-only node: {n!r}")
            n.direct += 1
            self._lock_up(n, root)
        self.stats.bookkeeping_seconds += perf_counter() - t0

    def _lock_up(self, n: RadixNode, stop: RadixNode) -> RadixNode:
        """One more lock_ref and use on `n` and its ancestors below `stop` (or the root), moving
        newly locked tokens from evictable to locked; returns where it stopped."""
        root = self._root
        while n is not root and n is not stop:
            if n.lock_ref == 0:
                size = len(n.key)
                self._evictable -= size
                self._locked += size
            n.lock_ref += 1
            n.uses += 1
            n = n.parent  # type: ignore[assignment]  # only the root has no parent
        return n

    def unlock(self, node: object) -> None:
        t0 = perf_counter()
        self._unlock(self._node(node))
        self.stats.bookkeeping_seconds += perf_counter() - t0

    def _unlock(self, n: RadixNode) -> None:
        root = self._root
        # A dead locked node can only come from reset(): its accounting is gone, so ignore.
        if n is not root and not n.dead:
            if n.direct <= 0:
                raise ValueError(f"unlock without a matching lock: {n!r}")
            n.direct -= 1
            while n is not root:
                n.lock_ref -= 1
                if n.lock_ref == 0:
                    size = len(n.key)
                    self._evictable += size
                    self._locked -= size
                    if gpu_leaf(n):
                        self._push(n)
                n = n.parent  # type: ignore[assignment]

    def _move_lock(self, node: RadixNode, old: RadixNode) -> None:
        """``lock(node)`` then ``unlock(old)``. When ``old`` is on ``node``'s path (always, for
        cache_unfinished) the two cancel from ``old`` up: only ``uses`` changes there."""
        root = self._root
        if node is root:
            self._unlock(old)
            return
        node.direct += 1
        n = self._lock_up(node, old)
        if n is root:
            self._unlock(old)
            return
        n.direct -= 1  # `old` keeps its lock_ref: the lock now comes from below
        while n is not root:
            n.uses += 1
            n = n.parent  # type: ignore[assignment]

    # -- insert -------------------------------------------------------------------------------
    # Caching a request's KV (insert, cache_unfinished, insert protection): radix_insert.py.
    insert = radix_insert.insert
    cache_unfinished = radix_insert.cache_unfinished

    # -- evict / alloc ------------------------------------------------------------------------
    # GPU-tier eviction (the leaf heap, the leaf-first walk, flush) lives in radix_evict.py.
    _push = radix_evict.push
    _evict = radix_evict.evict_leaves
    flush = radix_evict.flush

    # -- host tier ----------------------------------------------------------------------------
    # The tree's host-tier paths (match on below the GPU, load back, host-only nodes):
    # radix_host.py.
    _match_host = radix_host.match_host
    load_host = radix_host.load_host
    loading = radix_host.loading
    _to_gpu = radix_host.to_gpu
    _drop = radix_host.drop
    undo_copies = radix_host.undo_copies

    def _unlink(self, node: RadixNode) -> None:
        """Take ``node`` out of the tree (its slots are already freed by the caller)."""
        parent = node.parent
        assert parent is not None
        del parent.children[node.key[0]]
        node.dead = True
        node.parent = None
        self._nodes -= 1
        if self.observer is not None:
            self.observer.evicted(node)

    def evict(self, n: int) -> int:
        t0 = perf_counter()
        freed = self._evict(n) if n > 0 else 0
        self.stats.bookkeeping_seconds += perf_counter() - t0
        return freed

    def alloc(self, n: int) -> list[int] | None:
        t0 = perf_counter()
        alloc = self.allocator
        free = alloc.free_count
        out: list[int] | None
        if n > free:
            if n > free + self._evictable:
                out = None  # cannot succeed: evict nothing
            else:
                # Always enough: every unlocked node is reachable leaf-first.
                self._evict(n - free)
                out = alloc.alloc(n)
        else:
            out = alloc.alloc(n)
        self.stats.bookkeeping_seconds += perf_counter() - t0
        return out

    def free_slots(self, slots: Sequence[int]) -> None:
        self.allocator.free(slots)

    def node_parent(self, node: object) -> object | None:
        n = self._node(node)
        return None if n is self._root else n.parent

    # -- reset / introspection ----------------------------------------------------------------
    def reset(self) -> None:
        for node in self._iter_nodes():
            node.dead = True  # handles held by requests become stale; unlock ignores them
            node.parent = None
        self._root = RadixNode([], [], None, 0)
        self._heap = []
        self._protected = {}
        self._evictable = 0
        self._locked = 0
        self._nodes = 0
        self.allocator.reset()
        if self.host is not None:
            self.host.reset()  # the host pool is lost with its model service
        if self.observer is not None:
            self.observer.reset()

    # Whole-tree walks (every node; the debug views tests and integrity checks compare against
    # a model of the cache): radix_walk.py.
    _iter_nodes = radix_walk.iter_nodes
    debug_paths = radix_walk.debug_paths
    debug_host_paths = radix_walk.debug_host_paths
    debug_prefix_map = radix_walk.debug_prefix_map

    # The invariants above, checked against a full walk (integrity.py reads the fields on
    # purpose; the host tier's too).
    check_integrity = integrity.check_radix_integrity
