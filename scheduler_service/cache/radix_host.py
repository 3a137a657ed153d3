"""The radix tree's host-tier paths (cache/radix_cache.py, issue 31): matching on through
host-only nodes, loading them back onto the GPU, a host-only node that gets GPU slots again,
and dropping a node with its host-only subtree.

A node is on the GPU when ``node.value`` is non-empty and host-only when it is ``[]`` (its KV
then lives in ``node.host``; ``host_tier.HostTier`` owns host slots, their LRU and the copy
queue). GPU-resident nodes form a subtree containing the root, so a match's GPU part ends at
the first host-only node and its host part continues below it. Saving on eviction is a branch
of the eviction walk (``radix_evict.evict_leaves``).

These functions are :class:`RadixCache` methods (bound in its class body); the cache owns every
field they touch.
"""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING

from scheduler_service.cache.prefix_cache import MatchResult
from scheduler_service.cache.radix_node import RadixNode, edge_match

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


def drop(tree: RadixCache, node: RadixNode) -> None:
    """Evict ``node`` for good, with its host-only subtree (their host copies freed)."""
    host = tree.host
    if host is not None:
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
