"""The radix tree's host-tier paths (cache/radix_cache.py, issue 31): matching on through
host-only nodes, loading them back onto the GPU, a host-only node that gets GPU slots again,
dropping a node with its host-only subtree, and undoing the copies of a step that failed.

A node is on the GPU when ``node.value`` is non-empty and host-only when it is ``[]`` (its KV
then lives in ``node.host``; ``host_tier.HostTier`` owns host slots, their LRU and the copy
queue). GPU-resident nodes form a subtree containing the root, so a match's GPU part ends at
the first host-only node and its host part continues below it. Saving on eviction is a branch
of the eviction walk (``radix_evict.evict_leaves``).

These functions are :class:`RadixCache` methods (bound in its class body); the cache owns every
field they touch.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING

from scheduler_service.cache.prefix_cache import MatchResult
from scheduler_service.cache.radix_node import RadixNode, edge_match, gpu_leaf

if TYPE_CHECKING:
    from scheduler_service.cache.radix_cache import RadixCache


def match_host(
    tree: RadixCache, node: RadixNode, toks: list[int], pos: int, n: int, now: int
) -> tuple[int, RadixNode | None]:
    """Continue a match below the GPU frontier ``node`` through host-only nodes; returns
    (host tokens matched, deepest host-only node covering exactly them)."""
    start = pos
    deepest: RadixNode | None = None
    while pos < n:
        child = node.children.get(toks[pos])
        if child is None:
            break
        k = edge_match(child.key, toks, pos, n)
        if k < len(child.key):
            child = tree._split(child, k)
        child.last_access = now
        node = deepest = child
        pos += k
        if k < len(node.key):
            break
    return pos - start, deepest


def load_host(tree: RadixCache, m: MatchResult) -> MatchResult | None:
    """Load the host part of match ``m`` back into GPU slots (the caller holds
    ``lock(m.node)``). Returns the whole match on the GPU, its lock moved to the new end
    node, with the host -> GPU copies queued for the next step; ``None`` (nothing
    changed) when there is no host part or no GPU room for it. The loaded slots are readable
    from the next step on (``loading``: the model service runs the load beside this step)."""
    host = tree.host
    end = m.host_node
    if host is None or not m.host_len or end is None:
        return None
    t0 = perf_counter()
    top = tree._node(m.node)
    path: list[RadixNode] = []
    n: RadixNode | None = tree._node(end)
    while n is not top:
        if n is None or n.dead or n.value:
            return None  # stale (the caller matched long ago)
        path.append(n)
        n = n.parent
    path.reverse()
    for p in path:
        p.pinned = True
    try:
        slots = tree.alloc(m.host_len)
    finally:
        for p in path:
            p.pinned = False
    if slots is None:
        return None
    keys = _path_keys(tree, path[-1])
    pos = 0
    depth = len(m.slots)
    for p in path:
        mine = slots[pos : pos + len(p.key)]
        host.load(p, mine)
        to_gpu(tree, p, keys, depth + pos, mine)
        pos += len(mine)
    host.stats.host_hit_tokens += m.host_len
    tree._move_lock(path[-1], top)
    tree.stats.bookkeeping_seconds += perf_counter() - t0
    return MatchResult(m.slots + slots, path[-1])


def loading(tree: RadixCache, m: MatchResult) -> bool:
    """``PrefixCache.loading``. Nodes loaded in this step were host-only when it began, and so
    was everything below them (the GPU part of the tree contains the root), so a GPU match
    that passes through one ends in one: its last slot tells."""
    host = tree.host
    return bool(host is not None and host.loading and m.slots and m.slots[-1] in host.loading)


def _path_keys(tree: RadixCache, node: RadixNode) -> list[int]:
    """The tokens of ``node``'s whole root path."""
    parts: list[list[int]] = []
    n: RadixNode | None = node
    while n is not None and n is not tree._root:
        parts.append(n.key)
        n = n.parent
    return [t for part in reversed(parts) for t in part]


def to_gpu(
    tree: RadixCache, node: RadixNode, keys: list[int], start: int, slots: list[int]
) -> None:
    """Host-only ``node`` (whose parent is on the GPU) gets GPU ``slots`` for its KV
    (loaded back, or computed again by a request); it keeps its host copy. Its tokens
    enter the GPU tier as evictable; ``keys[:start + len(slots)]`` is its root path."""
    node.value = slots
    tree._evictable += len(slots)
    if tree.observer is not None:
        tree.observer.added(node, keys[: start + len(slots)], start)
    if tree.host is not None:
        tree.host.push(node)  # both tiers: its host copy can be dropped at no loss


def drop(tree: RadixCache, node: RadixNode, lost: bool = True) -> None:
    """Evict ``node`` for good, with its host-only subtree (their host copies freed).
    ``lost``: counted as evicted with no room on the host (``HostStats.lost_tokens``)."""
    host = tree.host
    if host is not None:
        if lost:
            host.stats.lost_tokens += len(node.key)
        stack = list(node.children.values())
        while stack:
            d = stack.pop()
            stack.extend(d.children.values())
            host.drop(d)
            if tree.observer is not None:
                tree.observer.evicted(d)
            d.dead = True
            d.parent = None
            tree._nodes -= 1
        host.drop(node)
        node.children = {}
    tree._unlink(node)


def undo_copies(tree: RadixCache, step_id: int, readers: Callable[[set[int]], None]) -> int:
    """``PrefixCache.undo_copies``: step ``step_id`` failed, so none of its copies counts as
    run (``HostTier.failed`` names the slots they, and later copies reading them, were to
    write). A host copy in one of those host slots is dropped (a host-only node with it leaves
    the tree, with its host-only subtree); a GPU node in one of those GPU slots leaves the GPU
    with the GPU nodes below it (each stays host-only if it has a good host copy, else leaves
    the tree). ``readers(gpu_slots)`` is called first: it releases every running request whose
    cached prefix holds one of them (they would read that garbage; their locks go with them).
    Returns the slots of both tiers this freed (``HostStats.undone_tokens``)."""
    host = tree.host
    if host is None:
        return 0
    bad_gpu, bad_host = host.failed(step_id)
    if not bad_gpu and not bad_host:
        return 0
    if bad_gpu:
        readers(bad_gpu)
    free_before = tree.allocator.free_count + host.allocator.free_count
    for node in list(tree._iter_nodes()):  # failures are rare: a whole-tree walk is fine
        if node.dead or node.host is None or bad_host.isdisjoint(node.host):
            continue
        host.drop(node)
        if not node.value:  # its KV is nowhere now
            _remove(tree, node)
    # Parents before children (depth first): a node's GPU subtree leaves with it.
    for node in list(tree._iter_nodes()):
        if node.dead or not node.value or bad_gpu.isdisjoint(node.value):
            continue
        parent = node.parent
        stack, below = [node], []
        while stack:
            n = stack.pop()
            below.append(n)
            stack.extend(c for c in n.children.values() if c.value)
        for n in reversed(below):  # children first: a GPU node's parent stays on the GPU
            _off_gpu(tree, n)
        root = tree._root
        if parent is not None and parent is not root and not parent.lock_ref and gpu_leaf(parent):
            tree._push(parent)  # an unlocked GPU leaf now: it needs its heap entry
    dropped = tree.allocator.free_count + host.allocator.free_count - free_before
    host.stats.undone_tokens += dropped
    return dropped


def _off_gpu(tree: RadixCache, node: RadixNode) -> None:
    """GPU ``node`` (unlocked; its GPU children gone already) loses its GPU slots: host-only
    when it has a host copy, else out of the tree."""
    if node.lock_ref:
        raise AssertionError(f"a failed copy's GPU slots are still read by a request: {node!r}")
    n = len(node.value)
    tree.allocator.free(node.value)
    tree._evictable -= n
    node.value = []
    if node.host is None:
        _remove(tree, node)
        return
    if tree.observer is not None:
        tree.observer.offloaded(node)
    assert tree.host is not None
    tree.host.push(node)


def _remove(tree: RadixCache, node: RadixNode) -> None:
    """Host-only ``node`` leaves the tree with its host-only subtree (not a loss to count)."""
    parent = node.parent
    drop(tree, node, lost=False)
    if tree.host is not None and parent is not None and parent is not tree._root:
        tree.host.push(parent)  # it may be a host-only leaf now
