"""Waiting-queue order: which requests the scheduler tries to admit first.

Policies (``--policy``):
- ``lpm``        longest cached prefix first, ties by arrival (SGLang's cache-aware order; with a
                 cache >= the longest request it equals a DFS of the batch's radix tree and
                 reaches the optimal hit rate, Theorem 3.1);
- ``dfs-weight`` DFS over the cached nodes that waiting requests matched, heaviest subtree
                 (most waiting requests) first, deeper matches before shallower ones;
- ``fcfs``       arrival order;
- ``lof``        longest output (max_new_tokens) first, ties by arrival;
- ``random``     seeded shuffle (an ablation).

Above ``lpm_fallback_queue_len`` waiting requests the cache-aware policies become FCFS so that
matching every request every step never dominates the step time (SGLang uses 128).

In-batch prefix sharing (SGLang): requests that share a prefix the cache does *not* hold yet
would each compute it if admitted together. ``deprioritize_shared_uncached`` admits the first of
each such group now and defers the others one round, when they hit the prefix the first one
inserted. Only cache-aware policies do this (they are the ones that computed matches).

Everything here is pure except that cache-aware policies call ``cache.match_prefix`` (which
refreshes LRU times and may split nodes, as matching always does) and store the result in each
item's ``match``.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Sequence
from typing import Protocol, TypeVar

from scheduler_service.cache.prefix_cache import (
    HOST_HIT_WEIGHT,
    MatchResult,
    PrefixCache,
    match_limit,
)

POLICY_NAMES = ("lpm", "dfs-weight", "fcfs", "lof", "random")
CACHE_AWARE_POLICIES = frozenset({"lpm", "dfs-weight"})


class WaitingLike(Protocol):
    """What the policy and the prefill adder need from a waiting request."""

    @property
    def tokens(self) -> Sequence[int]:
        """Everything to prefill: the prompt plus any output so far (resumed requests)."""
        ...

    @property
    def arrival(self) -> int:
        """Monotonic arrival number (FCFS key and tie-breaker)."""
        ...

    @property
    def max_new_tokens(self) -> int: ...

    @property
    def prefix_limit(self) -> int | None:
        """Most tokens the cache may serve (prompt logprobs), or None for no extra limit."""
        ...

    match: MatchResult | None


W = TypeVar("W", bound=WaitingLike)


# The FCFS key, in C: with a backlog the whole queue is ordered at every admission round.
_arrival = operator.attrgetter("arrival")


class SchedulePolicy:
    """Orders the waiting queue. Stateless apart from the random generator."""

    def __init__(
        self,
        name: str = "lpm",
        *,
        lpm_fallback_queue_len: int = 128,
        in_batch_prefix_threshold: int = 32,
        seed: int = 0,
    ) -> None:
        if name not in POLICY_NAMES:
            raise ValueError(f"unknown policy {name!r}; expected one of {POLICY_NAMES}")
        self.name = name
        self.lpm_fallback_queue_len = lpm_fallback_queue_len
        self.in_batch_prefix_threshold = in_batch_prefix_threshold
        self._rng = random.Random(seed)

    def effective_name(self, queue_len: int) -> str:
        """The policy actually applied to a queue of this length (LPM -> FCFS fallback)."""
        if self.name in CACHE_AWARE_POLICIES and queue_len > self.lpm_fallback_queue_len:
            return "fcfs"
        return self.name

    def order(self, waiting: Sequence[W], cache: PrefixCache) -> list[W]:
        """Admission order of ``waiting`` (a new list; the input is not modified).

        Cache-aware policies set every item's ``match`` (capped by ``match_limit``); the others
        leave ``match`` alone, and the prefill adder matches at admission time.
        """
        eff = self.effective_name(len(waiting))
        if eff == "fcfs":
            return sorted(waiting, key=_arrival)
        if eff == "lof":
            return sorted(waiting, key=lambda w: (-w.max_new_tokens, w.arrival))
        if eff == "random":
            out = sorted(waiting, key=_arrival)  # the result depends only on the seed
            self._rng.shuffle(out)
            return out
        lengths: dict[int, float] = {}
        for w in waiting:
            toks = w.tokens
            m = cache.match_prefix(toks, match_limit(len(toks), w.prefix_limit))
            w.match = m
            # A host-tier hit ranks between a GPU hit and recomputing (HOST_HIT_WEIGHT).
            lengths[id(w)] = m.length + HOST_HIT_WEIGHT * m.host_len
        if eff == "lpm":
            return sorted(waiting, key=lambda w: (-lengths[id(w)], w.arrival))
        return _dfs_weight_order(waiting, cache)

    def schedule(self, waiting: Sequence[W], cache: PrefixCache) -> tuple[list[W], list[W]]:
        """``order`` plus in-batch prefix sharing: ``(admit_now_candidates, deferred)``.

        ``deferred`` keep their relative order and should stay in the queue for the next round.
        """
        ordered = self.order(waiting, cache)
        if (
            self.effective_name(len(waiting)) in CACHE_AWARE_POLICIES
            and self.in_batch_prefix_threshold > 0
        ):
            return deprioritize_shared_uncached(ordered, self.in_batch_prefix_threshold)
        return ordered, []


def _dfs_weight_order(waiting: Sequence[W], cache: PrefixCache) -> list[W]:
    """DFS over the cached nodes the waiting requests matched, weighted by waiting requests.

    Approach: group requests by their match node, then walk each group's node up to the root
    through ``cache.node_parent``, adding the group size to every ancestor's weight. That builds
    the (small) subtree of the cache spanned by the matches without touching tokens: O(n x
    depth). A post-order DFS then visits children by descending weight (ties: earliest
    arrival), emitting a node's own requests after its children, so deeper matches come first
    inside a subtree, as in LPM, while whole heavy subtrees are kept together.
    """
    by_node: dict[object, list[W]] = {}
    for w in sorted(waiting, key=_arrival):
        assert w.match is not None
        by_node.setdefault(w.match.node, []).append(w)
    weight: dict[object, int] = {}
    first: dict[object, int] = {}  # earliest arrival in the subtree
    kids: dict[object, list[object]] = {}
    root: object | None = None
    for node, items in by_node.items():
        count, arrival = len(items), items[0].arrival
        n: object = node
        while True:
            seen = n in weight
            weight[n] = weight.get(n, 0) + count
            if not seen or arrival < first[n]:
                first[n] = arrival
            parent = cache.node_parent(n)
            if parent is None:
                root = n
                break
            if not seen:
                kids.setdefault(parent, []).append(n)
            n = parent
    if root is None:
        return []
    out: list[W] = []
    stack: list[tuple[object, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            out.extend(by_node.get(node, ()))
            continue
        stack.append((node, True))
        children = sorted(kids.get(node, ()), key=lambda c: (-weight[c], first[c]))
        stack.extend((c, False) for c in reversed(children))
    return out


def deprioritize_shared_uncached(
    ordered: Sequence[W], threshold: int = 32
) -> tuple[list[W], list[W]]:
    """Split ``ordered`` into ``(admit_now, deferred)`` for in-batch prefix sharing.

    Two requests share an uncached run of ``threshold`` tokens when they matched the same cache
    node and the ``threshold`` tokens right after their match are equal; the first in order is
    admitted, the later ones are deferred so they hit the cache next round. Keys are
    ``(match node, next threshold tokens)``, so this is O(n x threshold). Items without a match
    count as matching nothing (key node ``None``). Requests with fewer than ``threshold``
    uncached tokens are never deferred. Sharing that starts at different match depths is not
    detected (rare: requests on one cached path match the same node).

    A request that may not take those tokens from the cache (prompt logprobs: ``prefix_limit``)
    is never deferred: waiting would gain it nothing. Before this rule, concurrent requests
    with prompt logprobs and a common chat template were admitted one per step, each deferral
    pointless (issue 26: the cause of the longer stall with prompt logprobs).
    """
    if threshold <= 0:
        return list(ordered), []
    seen: set[tuple[object, tuple[int, ...]]] = set()
    now: list[W] = []
    later: list[W] = []
    for w in ordered:
        m = w.match
        start = m.length if m is not None else 0
        toks = w.tokens
        if len(toks) - start < threshold:
            now.append(w)
            continue
        key = (m.node if m is not None else None, tuple(toks[start : start + threshold]))
        # what a later round could take from the cache: its limit, and the token it computes
        could_hit = match_limit(len(toks), w.prefix_limit) + 1 - start >= threshold
        if key in seen and could_hit:
            later.append(w)
        else:
            seen.add(key)  # it computes the run now: later ones may hit it
            now.append(w)
    return now, later
