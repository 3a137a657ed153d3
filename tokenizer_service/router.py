"""Which replica gets a request: a pure policy over the replicas' views (no I/O, no protobuf).

Policies (`--router`):
- cache_aware (default, the paper's A.4 and SGLang's router, on real cache contents where the
  replicas publish them): hash the prompt's cache keys into chained blocks and find each
  replica's longest run of leading blocks it holds.
  * Some replica holds at least `cache_threshold` of the prompt's blocks (SGLang's 0.5): the
    longest match wins (ties: least loaded, then the rendezvous order below) -> `cache_hit`;
    unless that replica is overloaded relative to the least-loaded replica, then the least
    loaded -> `balance`.
  * Otherwise (nothing, or only a short shared start such as a common system prompt, is
    cached anywhere): the least loaded, ties broken by the rendezvous order of the prompt's
    first block -> `cold`. Rendezvous (highest hash of (block, replica address)) needs no
    shared state: on an idle system every front door that sees the same replicas sends the
    same cold prefix to the same one, and different prefixes spread evenly.
  "Overloaded", in tokens or in requests: load - min_load > abs AND load > balance_rel *
  min_load (both, as SGLang's router: small absolute gaps never count, nor large ones on a
  busy system that is balanced in proportion), min_load over the candidates; abs is
  balance_abs_tokens for tokens (prefill and KV work: long prompts) and balance_abs_requests
  for requests (many short requests sharing one hot prefix are little token work each, yet
  they all decode on one replica). Load as replica_view counts it.
- round_robin: the eligible replicas in address order, in turn -> `round_robin`.
- least_load: the least loaded (ties: rendezvous) -> `least_load`.

Invariant: `choose` is deterministic given its inputs and the round-robin counter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from tokenizer_service.replica_view import ReplicaView


class Policy(str, Enum):
    CACHE_AWARE = "cache_aware"
    ROUND_ROBIN = "round_robin"
    LEAST_LOAD = "least_load"


REASONS = ("cache_hit", "balance", "cold", "least_load", "round_robin")


@dataclass(frozen=True)
class Candidate:
    address: str  # stable across front doors: the rendezvous key
    view: ReplicaView


@dataclass(frozen=True)
class Decision:
    address: str
    reason: str
    matched_blocks: int = 0


@dataclass(frozen=True)
class Balance:
    abs_tokens: int = 1024
    rel: float = 1.5
    abs_requests: int = 8

    def overloaded(self, view: ReplicaView, candidates: Sequence[Candidate]) -> bool:
        least_tokens = min(c.view.load_tokens for c in candidates)
        least_requests = min(c.view.load_requests for c in candidates)
        return self._over(view.load_tokens, least_tokens, self.abs_tokens) or self._over(
            view.load_requests, least_requests, self.abs_requests
        )

    def _over(self, load: int, least: int, gap: int) -> bool:
        return load - least > gap and load > self.rel * least


class Router:
    def __init__(
        self,
        policy: Policy = Policy.CACHE_AWARE,
        balance: Balance | None = None,
        cache_threshold: float = 0.5,
    ) -> None:
        self.policy = policy
        self.balance = balance or Balance()
        self.cache_threshold = cache_threshold
        self._turn = 0

    def choose(self, candidates: Sequence[Candidate], hashes: Sequence[int], key: int) -> Decision:
        """`hashes`: the prompt's block hashes (cache_aware only); `key`: a number standing for
        the prompt's start (its first block hash, or a hash of a shorter prompt), the
        rendezvous key when no cache decides. `candidates` must not be empty."""
        if not candidates:
            raise ValueError("no replica to route to")
        if self.policy is Policy.ROUND_ROBIN:
            ordered = sorted(candidates, key=lambda c: c.address)
            pick = ordered[self._turn % len(ordered)]
            self._turn += 1
            return Decision(pick.address, "round_robin")
        if self.policy is Policy.LEAST_LOAD:
            return Decision(_least_loaded(candidates, key).address, "least_load")
        return self._cache_aware(candidates, hashes, key)

    def _cache_aware(
        self, candidates: Sequence[Candidate], hashes: Sequence[int], key: int
    ) -> Decision:
        matched = {c.address: c.view.matched_blocks(hashes) for c in candidates}
        best = max(matched.values())
        least = _least_loaded(candidates, key)
        if best > 0 and best >= self.cache_threshold * len(hashes):
            holders = [c for c in candidates if matched[c.address] == best]
            pick = _least_loaded(holders, key)
            if not self.balance.overloaded(pick.view, candidates):
                return Decision(pick.address, "cache_hit", best)
            return Decision(least.address, "balance", matched[least.address])
        return Decision(least.address, "cold", matched[least.address])


def _least_loaded(candidates: Sequence[Candidate], key: int) -> Candidate:
    return min(candidates, key=lambda c: (c.view.load_tokens, -rendezvous(key, c.address)))


def rendezvous(key: int, address: str) -> int:
    """The weight of `address` for `key` (highest wins): the same on every front door."""
    h = hashlib.blake2b(key.to_bytes(8, "little"), digest_size=8)
    h.update(address.encode())
    return int.from_bytes(h.digest(), "little")


def prompt_key(hashes: Sequence[int], keys: Sequence[int]) -> int:
    """The rendezvous key of a prompt: its first block's hash, or for a prompt shorter than
    one block a hash of its keys (namespace included, as in the block hashes)."""
    if hashes:
        return int(hashes[0])
    h = hashlib.blake2b(digest_size=8)
    for k in keys:
        h.update(int(k).to_bytes(16, "little"))
    return int.from_bytes(h.digest(), "little")
