"""GPU-tier eviction of the radix tree (cache/radix_cache.py): the heap of unlocked GPU leaves,
the leaf-first walk that frees slots, and flush.

The heap holds ``(eviction key at push time, seq, node)``; entries are invalidated lazily (a
node that was locked, used again, got a GPU child or left the tree is skipped when popped), so
every unlocked GPU leaf has one valid entry (the tree's invariant) and stale ones are compacted
when they outnumber the tree.

Eviction order (``--eviction``): ``lru`` (least recently matched/inserted first,
``radix_node.lru_key``) or ``lfu`` (fewest uses first, ties LRU; a use is a lock, i.e. a request
admitted or continued through the node: ``lfu_key``). It ignores insert protection
(``--protect-ms``, which only keeps protected tokens out of the admission budget): when
eviction does run, a dead fresh tail should not outrank a prefix that waiting requests matched
(measured: tree-of-thought lost 4 % of its hits that way).

An evicted leaf's KV is saved to the host tier when there is one (the node stays in the tree,
host-only) or dropped with its host-only subtree; a parent that becomes an unlocked GPU leaf is
then a candidate itself, so shared ancestors live longest.

These functions are :class:`RadixCache` methods (bound in its class body, so the hot paths pay
no wrapper call); the cache owns every field they touch.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from scheduler_service.cache.radix_node import RadixNode, gpu_leaf

if TYPE_CHECKING:
    from scheduler_service.cache.radix_cache import RadixCache


def push(tree: RadixCache, node: RadixNode) -> None:
    """Give ``node`` (an unlocked GPU leaf, or one whose key changed) a heap entry."""
    heap = tree._heap
    heapq.heappush(heap, (tree._key(node), next(tree._seq), node))
    # Lazy invalidation lets stale entries pile up under match-heavy load; rebuild when the
    # heap is much larger than the tree (amortised O(1) per push).
    if len(heap) > 2 * tree._nodes + 256:
        _rebuild_heap(tree)


def _rebuild_heap(tree: RadixCache) -> None:
    key = tree._key
    heap = [
        (key(n), next(tree._seq), n)
        for n in tree._iter_nodes()
        if n.value and n.lock_ref == 0 and gpu_leaf(n)
    ]
    heapq.heapify(heap)
    tree._heap = heap


def evict_leaves(tree: RadixCache, n: int) -> int:
    """Free at least ``n`` GPU tokens (fewer only when the heap runs dry), least valuable
    unlocked leaf first; returns the tokens freed (``stats.evicted_tokens``)."""
    freed = 0
    heap = tree._heap
    root = tree._root
    free = tree.allocator.free
    key = tree._key
    obs = tree.observer
    host = tree.host
    node: RadixNode | None = None
    while freed < n:
        if node is None:
            if not heap:
                break
            t, _, node = heapq.heappop(heap)
            if node.dead or not node.value or node.lock_ref or key(node) != t or not gpu_leaf(node):
                node = None
                continue  # stale entry
        size = len(node.value)
        freed += size
        tree._evictable -= size
        parent = node.parent
        assert parent is not None
        if host is not None and not tree._flushing and host.save(node):
            free(node.value)  # the queued save runs before any new use of these slots
            node.value = []  # host-only now: it keeps its place in the tree
            if obs is not None:
                obs.offloaded(node)  # its blocks stay published, as host-resident
        else:
            free(node.value)
            tree._drop(node)  # tells the observer (the node and its host-only subtree)
        node = None
        if parent is not root and parent.lock_ref == 0 and gpu_leaf(parent):
            # It just became an unlocked leaf. When it would be the very next pop (its key
            # below every entry's; a tie would go to the older entry) evict it directly:
            # a finished request's prompt node and output leaf go together without a
            # push/pop round trip, in exactly the heap's order.
            if freed < n and (not heap or key(parent) < heap[0][0]):
                node = parent
            else:
                push(tree, parent)
                heap = tree._heap  # push may have rebuilt it
    tree.stats.evicted_tokens += freed
    return freed


def flush(tree: RadixCache) -> int:
    """Drop every unlocked entry of both tiers, saving nothing (FlushCache); returns the
    GPU tokens freed. Loads already queued for locked nodes stay queued."""
    tree._flushing = True
    try:
        freed = tree.evict(tree._evictable)
    finally:
        tree._flushing = False
    host = tree.host
    if host is not None:
        host.forget_pending()
        for node in list(tree._iter_nodes()):
            if node.dead:
                continue  # dropped with an ancestor just now
            if node.value:
                host.drop(node)
            else:  # a host-only subtree under a locked GPU node
                tree._drop(node)
    return freed
