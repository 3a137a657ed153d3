"""Caching a request's KV in the radix tree (cache/radix_cache.py): ``insert`` (a request
leaves: finished, retracted or aborted) and ``cache_unfinished`` (a prefill chunk of a request
that keeps running), each one walk down the tree.

What a walk does with each edge: tokens the tree already holds keep the tree's slots (the
caller's duplicate copies are freed, ``insert``) or refuse the call (``cache_unfinished``: the
request's slots must not change under the model service); a host-only node takes the caller's
fresh GPU slots (``radix_host.to_gpu``); the rest becomes a new leaf. Every node of the path is
stamped with the call's LRU tick and, with ``--protect-ms``, insert protection.

These functions are :class:`RadixCache` methods (bound in its class body, so the scheduler's
per-request calls pay no wrapper call); the cache owns every field they touch.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import TYPE_CHECKING

from scheduler_service.cache.prefix_cache import CachedPrefix
from scheduler_service.cache.radix_node import RadixNode, as_list, edge_match, gpu_leaf

if TYPE_CHECKING:
    from scheduler_service.cache.radix_cache import RadixCache


def insert(tree: RadixCache, tokens: Sequence[int], slots: Sequence[int]) -> tuple[int, object]:
    """``PrefixCache.insert``: cache ``tokens -> slots`` (the caller's slots become the tree's;
    duplicates of cached tokens are freed); returns (tokens cached before, the path's end)."""
    t0 = perf_counter()
    toks = as_list(tokens)
    sl = as_list(slots)
    n = len(toks)
    if len(sl) != n:
        raise ValueError(f"insert: {n} tokens but {len(sl)} slots")
    tree._clock += 1
    now = tree._clock
    node = tree._root
    pos = 0
    cached = -1
    path: list[RadixNode] = []
    while pos < n:
        child = node.children.get(toks[pos])
        if child is None:
            cached = pos
            node = _add_leaf(tree, node, toks, sl, pos, now)
            path.append(node)
            break
        key = child.key
        k = edge_match(key, toks, pos, n)
        if child.value:
            _free_duplicates(tree, child.value, sl, pos, k)
            if k < len(key):
                child = tree._split(child, k)
        else:  # host-only: the caller's fresh GPU copy puts it back on the GPU
            if k < len(key):
                child = tree._split(child, k)
            if cached < 0:
                cached = pos
            tree._to_gpu(child, toks, pos, sl[pos : pos + k])
        child.last_access = now
        node = child
        path.append(child)
        pos += k
    if cached < 0:
        cached = n  # everything was already there
    _protect(tree, path)
    if tree.host is not None:
        tree.host.written(path)  # write-through: queue the path's copies to the host
    if node is not tree._root and node.lock_ref == 0 and gpu_leaf(node):
        tree._push(node)
    tree.stats.bookkeeping_seconds += perf_counter() - t0
    return cached, node


def cache_unfinished(
    tree: RadixCache, tokens: Sequence[int], slots: Sequence[int], old_node: object
) -> CachedPrefix | None:
    """Insert the computed part of a still-running request and move its lock there.

    Afterwards the request holds ``lock(result.node)`` instead of ``lock(old_node)`` and all
    of ``tokens`` belong to the cache (``cached_len == len(tokens)``). ``None`` (nothing
    changed) if the tree already holds some of ``tokens`` in other slots.

    Equivalent to a check, ``insert``, ``lock(node)``, ``unlock(old_node)``, done in one
    walk and timed as one op (this runs for every prefilled chunk, so the separate calls'
    second walk, duplicate-slot slicing and timer pairs were most of its cost).
    """
    t0 = perf_counter()
    toks = as_list(tokens)
    sl = as_list(slots)
    old = tree._node(old_node)
    n = len(toks)
    if len(sl) != n:
        raise ValueError(f"cache_unfinished: {n} tokens but {len(sl)} slots")
    root = tree._root
    if old is not root and not old.dead and old.direct <= 0:
        raise ValueError(f"unlock without a matching lock: {old!r}")
    # Walk without changing anything: a refusal must leave the tree as it was.
    node = root
    pos = 0
    cut = 0  # > 0: the walk ends this many tokens into `child`'s edge (split needed)
    child: RadixNode | None = None
    path: list[RadixNode] = []
    while pos < n:
        child = node.children.get(toks[pos])
        if child is None:
            break
        key = child.key
        k = edge_match(key, toks, pos, n)
        val = child.value
        if (val if k == len(val) else val[:k]) != sl[pos : pos + k]:
            tree.stats.bookkeeping_seconds += perf_counter() - t0
            return None  # held in other slots: the request keeps its own
        pos += k
        if k < len(key):
            cut = k
            break
        path.append(child)
        node = child
    tree._clock += 1
    now = tree._clock
    if cut:
        assert child is not None
        node = tree._split(child, cut)
        path.append(node)
    elif pos < n:
        node = _add_leaf(tree, node, toks, sl, pos, now)
        path.append(node)
    for p in path:
        p.last_access = now
    _protect(tree, path)
    tree._move_lock(node, old)
    tree.stats.bookkeeping_seconds += perf_counter() - t0
    return CachedPrefix(node, n)


def _add_leaf(
    tree: RadixCache, node: RadixNode, toks: list[int], sl: list[int], pos: int, now: int
) -> RadixNode:
    """A new leaf under ``node`` for ``toks[pos:]`` in ``sl[pos:]``; its tokens enter the
    cache as evictable (the caller locks it if it must not be)."""
    # Edge slices copy, so the caller may keep mutating its own lists.
    leaf = RadixNode(toks[pos:], sl[pos:], node, now)
    node.children[toks[pos]] = leaf
    tree._nodes += 1
    added = len(toks) - pos
    tree._evictable += added
    tree.stats.inserted_tokens += added
    if tree.observer is not None:
        tree.observer.added(leaf, toks, pos)
    return leaf


def _free_duplicates(tree: RadixCache, cached: list[int], sl: list[int], pos: int, k: int) -> None:
    """The caller computed tokens the tree already holds: free the caller's copies.

    Positions where the caller passes the tree's own slot (its locked prefix) are not
    duplicates and stay.
    """
    mine = sl[pos : pos + k]
    if mine == (cached if k == len(cached) else cached[:k]):  # usually the caller's own
        return  # locked prefix: no copies (and no slice of a whole edge to compare)
    tree.allocator.free([s for s, c in zip(mine, cached, strict=False) if s != c])


def _protect(tree: RadixCache, path: list[RadixNode]) -> None:
    """Insert protection (``--protect-ms``) for a just-inserted path."""
    if tree.protect_s > 0 and path:
        until = tree._now() + tree.protect_s
        prot = tree._protected
        for p in path:  # the whole path: a parent stays at least as protected as a child
            p.protect_until = until
            prot[p] = None
