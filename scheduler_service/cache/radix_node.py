"""A node of the radix tree (cache/radix_cache.py) and the pure helpers that match token runs
against its edges and order its eviction. No tree state here: the tree owns its nodes and
every change to them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class RadixNode:
    __slots__ = (
        "key",
        "value",
        "parent",
        "children",
        "lock_ref",
        "direct",
        "last_access",
        "dead",
        "uses",
        "protect_until",
        "host",
        "pinned",
    )

    def __init__(
        self, key: list[int], value: list[int], parent: RadixNode | None, now: int
    ) -> None:
        self.key = key  # token ids on the edge from the parent
        self.value = value  # KV slot of each token on the edge
        self.parent = parent
        self.children: dict[int, RadixNode] = {}  # keyed by the child's first token
        self.lock_ref = 0  # locks on this node or any descendant
        self.direct = 0  # locks taken on exactly this node
        self.last_access = now  # logical clock tick of the latest match/insert through it
        self.dead = False  # evicted, or dropped by reset(): the handle is stale
        self.uses = 0  # locks ever taken through this node (the LFU frequency)
        self.protect_until = 0.0  # held out of the admission budget until this clock() time
        # Host tier (issue 31): host slot of each token, or None. A node is on the GPU when
        # `value` is non-empty, host-only when `value` is [] (then `host` is set).
        self.host: list[int] | None = None
        self.pinned = False  # being loaded back: the host tier must not drop it

    def __repr__(self) -> str:
        head = self.key[:4]
        more = "..." if len(self.key) > 4 else ""
        return f"RadixNode(len={len(self.key)}, key={head}{more}, lock={self.lock_ref})"


_CANONICAL: dict[int, int] = {}


def intern_tokens(tokens: Iterable[int]) -> list[int]:
    """``tokens`` as a list of canonical int objects (one object per distinct id).

    Matching compares token lists; CPython compares list items by identity before value, so
    lists holding the *same* int objects compare several times faster than lists of equal but
    distinct ints (which is what unpacking a protobuf gives every request): about 2.5x on LPM
    ordering of long prompts; correctness never depends on it. Memory is bounded by the
    vocabulary. The scheduler does not call it today: interning on arrival costs ~10 us per
    request outside the cache, about what it would save inside (tests/load/radix_replay.py).
    """
    canon = _CANONICAL
    return [canon.setdefault(t, t) for t in tokens]


def gpu_leaf(node: RadixNode) -> bool:
    """No child on the GPU (host-only children do not keep a node on the GPU). A loop, not
    all(): this runs on every unlock and eviction, and a generator costs more."""
    for c in node.children.values():  # noqa: SIM110
        if c.value:
            return False
    return True


def lru_key(node: RadixNode) -> int:
    return node.last_access


def lfu_key(node: RadixNode) -> tuple[int, int]:
    return (node.uses, node.last_access)


def as_list(seq: Sequence[int]) -> list[int]:
    # Edges are lists; list == tuple is always False, so normalise once per call.
    return seq if type(seq) is list else list(seq)


def edge_match(key: list[int], toks: list[int], pos: int, n: int) -> int:
    """How many tokens of the edge ``key`` match ``toks[pos:n]`` (the whole edge in one C-level
    list compare when it fits, else token by token)."""
    end = pos + len(key)
    if end <= n and key == toks[pos:end]:
        return len(key)
    return common_len(key, toks, pos, min(end, n))


def common_len(key: list[int], toks: list[int], start: int, stop: int) -> int:
    """Length of the common prefix of ``key`` and ``toks[start:stop]``.

    Long edges (thousands of tokens) are common, so this compares slices (C speed) and bisects
    to the first difference instead of stepping token by token in Python.
    """
    n = min(len(key), stop - start)
    if n <= 0:
        return 0
    if key[:n] == toks[start : start + n]:
        return n
    lo, hi = 0, n  # key[:lo] matches; key[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if key[lo:mid] == toks[start + lo : start + mid]:
            lo = mid
        else:
            hi = mid
    return lo
