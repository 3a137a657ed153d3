"""Integrity checks of :class:`~scheduler_service.cache.radix_cache.RadixCache` (tests, debug mode).

Reads the cache's private fields on purpose: it verifies them against a full walk of the tree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler_service.cache.radix_cache import RadixCache
    from scheduler_service.cache.radix_node import RadixNode


def check_radix_integrity(
    cache: RadixCache,
    request_owned: int,
    request_slots: Sequence[int] | None = None,
    *,
    deep: bool = True,
) -> None:
    """``RadixCache.check_integrity``: raise ``AssertionError`` unless every invariant in the
    radix_cache module docstring holds."""

    def fail(msg: str) -> None:
        raise AssertionError(f"radix cache integrity: {msg}")

    root = cache._root
    if root.lock_ref or root.key or root.value:
        fail("root must stay empty and unlocked")
    evictable = locked = nodes = 0
    tree_slots: list[int] = []
    unlocked_leaves: list[RadixNode] = []
    stack = [root]
    while stack:
        node = stack.pop()
        child_locks = 0
        for tok, child in node.children.items():
            if child.dead:
                fail(f"dead node still in the tree: {child!r}")
            if child.parent is not node:
                fail(f"bad parent pointer at {child!r}")
            _check_tiers(child, node, root, fail)
            if child.key[0] != tok:
                fail(f"child keyed by {tok} but its edge starts with {child.key[0]}")
            if child.lock_ref < 0 or child.direct < 0:
                fail(f"negative lock count at {child!r}")
            child_locks += child.lock_ref
            stack.append(child)
        if node is root:
            continue
        nodes += 1
        if node.lock_ref != node.direct + child_locks:
            fail(
                f"lock_ref {node.lock_ref} != direct {node.direct} + children {child_locks}"
                f" at {node!r}"
            )
        parent = node.parent
        if (
            parent is not None
            and parent is not root
            and (parent.protect_until < node.protect_until)
        ):
            fail(f"{node!r} is protected longer than its parent")
        if not node.value:
            continue  # host-only: outside the GPU tier's accounting
        if node.lock_ref:
            locked += len(node.key)
        else:
            evictable += len(node.key)
            if not any(c.value for c in node.children.values()):
                unlocked_leaves.append(node)
        if deep:
            tree_slots += node.value
    if nodes != cache._nodes:
        fail(f"node count {cache._nodes} but {nodes} nodes in the tree")
    if evictable != cache._evictable or locked != cache._locked:
        fail(
            f"sizes say evictable={cache._evictable} locked={cache._locked}, tree has "
            f"evictable={evictable} locked={locked}"
        )
    if cache.host is not None:
        check_host_integrity(cache, deep=deep)
    cap = cache.allocator.capacity
    if not deep:
        total = cache.allocator.free_count + evictable + locked + request_owned
        if total != cap:
            fail(
                f"free {cache.allocator.free_count} + evictable {evictable} + locked {locked}"
                f" + request_owned {request_owned} = {total} != capacity {cap}"
            )
        return
    tree_set = set(tree_slots)
    if len(tree_set) != len(tree_slots):
        fail(f"{len(tree_slots) - len(tree_set)} slots appear twice in the tree")
    if any(not 0 <= s < cap for s in tree_set):
        fail("slot id out of range in the tree")
    free = cache.allocator.free_list()
    free_set = set(free)
    if len(free_set) != len(free):
        fail("allocator free list holds a slot twice")
    both = tree_set & free_set
    if both:
        fail(f"slots both cached and free: {sorted(both)[:10]}")
    if request_slots is not None:
        req_set = set(request_slots)
        if len(req_set) != len(request_slots):
            fail("a slot is held twice by requests")
        if req_set & tree_set:
            fail(f"slots both request-owned and cached: {sorted(req_set & tree_set)[:10]}")
        if req_set & free_set:
            fail(f"slots both request-owned and free: {sorted(req_set & free_set)[:10]}")
        if len(req_set) != request_owned:
            fail(f"request_owned={request_owned} but {len(req_set)} request slots given")
    total = len(free) + evictable + locked + request_owned
    if total != cap:
        fail(
            f"free {len(free)} + evictable {evictable} + locked {locked} + request_owned "
            f"{request_owned} = {total} != capacity {cap}"
        )
    key = cache._key
    valid = {
        id(n)
        for t, _, n in cache._heap
        if not n.dead and n.value and not n.lock_ref and key(n) == t
    }
    missing = [n for n in unlocked_leaves if id(n) not in valid]
    if missing:
        fail(f"unlocked leaves missing from the eviction heap: {missing[:3]}")


def _check_tiers(
    child: RadixNode, parent: RadixNode, root: RadixNode, fail: Callable[[str], None]
) -> None:
    """A node's tiers are consistent with its slots: GPU slots for every token or none, host
    slots for every token or none, at least one of the two; the GPU-resident nodes form a
    subtree containing the root (a GPU node's parent is on the GPU); nothing host-only is
    locked or pinned."""
    n = len(child.key)
    if not n or len(child.value) not in (0, n):
        fail(f"bad edge {child!r}: {n} tokens, {len(child.value)} slots")
    if child.host is not None and len(child.host) != n:
        fail(f"bad host copy {child!r}: {n} tokens, {len(child.host)} host slots")
    if not child.value and child.host is None:
        fail(f"{child!r} holds its KV in neither tier")
    if child.value and parent is not root and not parent.value:
        fail(f"{child!r} is on the GPU under a host-only parent")
    if not child.value and child.lock_ref:
        fail(f"host-only {child!r} is locked")
    if child.pinned:
        fail(f"{child!r} is still pinned")


def check_host_integrity(cache: RadixCache, *, deep: bool = True) -> None:
    """The host tier's invariants (``host_tier`` module docstring): ``free + held ==
    capacity``, each host slot once and never free, every eligible node in its LRU heap."""
    from scheduler_service.cache.host_tier import eligible

    def fail(msg: str) -> None:
        raise AssertionError(f"host tier integrity: {msg}")

    host = cache.host
    assert host is not None
    held = 0
    slots: list[int] = []
    want_heap: list[RadixNode] = []
    for node in cache._iter_nodes():
        if node.host is not None:
            held += len(node.host)
            if deep:
                slots += node.host
                if eligible(node):
                    want_heap.append(node)
    if held != host.held:
        fail(f"held says {host.held} host tokens, the tree holds {held}")
    alloc = host.allocator
    if alloc.free_count + held != alloc.capacity:
        fail(f"free {alloc.free_count} + held {held} != capacity {alloc.capacity}")
    if not deep:
        return
    if len(set(slots)) != len(slots):
        fail("a host slot is held by two nodes")
    if any(not 0 <= s < alloc.capacity for s in slots):
        fail("host slot id out of range")
    both = set(slots) & set(alloc.free_list())
    if both:
        fail(f"host slots both held and free: {sorted(both)[:10]}")
    in_heap = host.heap_nodes()
    missing = [n for n in want_heap if id(n) not in in_heap]
    if missing:
        fail(f"eligible nodes missing from the host LRU heap: {missing[:3]}")
