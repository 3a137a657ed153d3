"""Walks over the whole radix tree (cache/radix_cache.py), O(nodes) or O(tokens x depth): every
node (heap rebuild, flush, reset, integrity checks) and the views that tests and integrity
checks compare against a model of the cache. Nothing on a per-request path calls them.

These functions are :class:`RadixCache` methods (bound in its class body); they only read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from scheduler_service.cache.radix_node import RadixNode

if TYPE_CHECKING:
    from scheduler_service.cache.radix_cache import RadixCache


def iter_nodes(tree: RadixCache) -> Iterator[RadixNode]:
    """All non-root nodes, depth first."""
    stack = list(tree._root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def debug_paths(tree: RadixCache) -> Iterator[tuple[object, int, list[int]]]:
    """Every GPU-resident non-root node with its depth above its edge and its whole root
    path's keys (tests and integrity checks only; O(tokens x depth))."""
    roots = tree._root.children.values()
    stack: list[tuple[RadixNode, list[int]]] = [(c, []) for c in roots if c.value]
    while stack:
        node, above = stack.pop()
        path = above + node.key
        yield node, len(above), path
        stack.extend((c, path) for c in node.children.values() if c.value)


def debug_host_paths(tree: RadixCache) -> Iterator[tuple[object, int, list[int]]]:
    """Every host-only node (KV in host memory only) with its depth above its edge and its
    whole root path's keys (tests and integrity checks only; O(tokens x depth))."""
    stack: list[tuple[RadixNode, list[int]]] = [(c, []) for c in tree._root.children.values()]
    while stack:
        node, above = stack.pop()
        path = above + node.key
        if not node.value:
            yield node, len(above), path
        stack.extend((c, path) for c in node.children.values())


def debug_prefix_map(tree: RadixCache) -> dict[tuple[int, ...], int]:
    """Every GPU-cached prefix -> KV slot of its last token (tests only; O(tokens x
    depth))."""
    out: dict[tuple[int, ...], int] = {}
    roots = tree._root.children.values()
    stack: list[tuple[RadixNode, tuple[int, ...]]] = [(c, ()) for c in roots if c.value]
    while stack:
        node, path = stack.pop()
        for tok, slot in zip(node.key, node.value, strict=True):
            path = path + (tok,)
            out[path] = slot
        stack.extend((c, path) for c in node.children.values() if c.value)
    return out
