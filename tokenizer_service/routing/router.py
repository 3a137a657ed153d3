"""Which replica gets a request: a pure policy over the replicas' views (no I/O, no protobuf).

Policies (`--router`):
- cache_aware (default, the paper's A.4 and SGLang's router, on real cache contents where the
  replicas publish them): hash the prompt's cache keys into chained blocks and find each
  replica's longest run of leading blocks it holds, in either tier. A match scores its
  GPU-resident blocks at 1 and its host-resident ones (issue 31: evicted from the GPU, kept in
  host memory, served with a copy) at HOST_HIT_WEIGHT, the scheduler's own weight of a host
  hit: a prefix on one replica's host beats no match anywhere, the same prefix on another's
  GPU beats it.
  * Some replica holds at least `cache_threshold` of the prompt's blocks (SGLang's 0.5; the
    blocks held in either tier count): the best score among the holders within their share
    wins (ties: least loaded, then the rendezvous order below) -> `cache_hit`; unless it has
    a backlog, then the least loaded -> `balance`. The prefix hot: its requests spread
    evenly, each to the replica under its share that took the fewest of them lately ->
    `share` (`cache_hit` if it held it).
  * Otherwise (nothing, or only a short shared start such as a common system prompt, is
    cached anywhere): among the replicas without a backlog (below), those within a small
    band (COLD_BAND_*) of the least of this front door's own live work there and, of those,
    the ones whose cache has about as much room as the roomiest (SGLang's router sends such
    a request to the smallest tree), the rendezvous winner of the prompt's first block ->
    `cold`. Own live work, not the shared load view: the view's reports lag a burst, and
    every front door chasing the same stale difference sent its whole stream to whichever
    replica had just reported (radixmesh_bench/router_burst.py); each front door spreading
    its own evenly spreads the sum evenly, however many there are. Rendezvous (highest hash
    of (block, replica address)) needs no shared state: front doors with the same replicas
    in their bands send the same cold prefix to the same one (on an idle system, all), and
    different prefixes spread evenly.
  "Overloaded", by either of two kinds of rule (Balance):
  * a backlog now, in tokens or in requests: load - min_load > abs AND load > balance_rel *
    min_load (both, as SGLang's router: small absolute gaps never count, nor large ones on a
    busy system that is balanced in proportion), min_load over the candidates; abs is
    balance_abs_tokens for tokens and balance_abs_requests for requests. Loose by default:
    queues fluctuate (a wave of equal-length requests finishing together), and moving a
    request off its prefix costs a recompute of that prefix.
  * sustained skew (TrafficShare): the replica took more than balance_share times an even
    share of this router's recent decisions, and the prefix the request is routed on is hot:
    its own requests carry, confidently, more than an even share of the decisions made since
    it appeared. A hot prefix (most of the traffic sharing one system prompt) is copied to
    the replicas under their share and its requests spread evenly over them; other prefixes
    stay where they are cached (many prefixes spread over the replicas, a conversation's own
    history), however the queues fluctuate.
  Load as replica_view counts it.
- round_robin: the eligible replicas in address order, in turn -> `round_robin`.
- least_load: of the replicas without a backlog, the least of this front door's own live work
  (ties: the least loaded, then rendezvous) -> `least_load`.

Invariant: `choose` is deterministic given its inputs and the round-robin counter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from tokenizer_service.routing.replica_view import Match, ReplicaView
from tokenizer_service.routing.traffic_share import TrafficShare


class Policy(str, Enum):
    CACHE_AWARE = "cache_aware"
    ROUND_ROBIN = "round_robin"
    LEAST_LOAD = "least_load"


REASONS = ("cache_hit", "balance", "share", "cold", "least_load", "round_robin")


@dataclass(frozen=True)
class Candidate:
    address: str  # stable across front doors: the rendezvous key
    view: ReplicaView


@dataclass(frozen=True)
class Decision:
    address: str
    reason: str
    matched_blocks: int = 0  # leading blocks of the prompt the chosen replica holds
    prefix_blocks: int = 0  # the longest any replica holds (what the decision weighed)
    host_blocks: int = 0  # of matched_blocks, those the chosen replica holds on its host tier


@dataclass(frozen=True)
class Balance:
    abs_tokens: int = 16384
    rel: float = 1.5
    abs_requests: int = 32
    share: float = 1.5  # 0: no share rule
    window: int = 64  # decisions: TrafficShare's memory

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
        self.share = TrafficShare(self.balance.window)

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
            return Decision(_least_own_work(candidates, key, self.balance).address, "least_load")
        d = self._cache_aware(candidates, hashes, key)
        # The prefix it was routed on: its deepest block that some replica holds.
        self.share.record(d.address, hashes[d.prefix_blocks - 1] if d.prefix_blocks else None)
        return d

    def _cache_aware(
        self, candidates: Sequence[Candidate], hashes: Sequence[int], key: int
    ) -> Decision:
        matched: dict[str, Match] = {c.address: c.view.match(hashes) for c in candidates}
        longest = max(m.blocks for m in matched.values())
        best = max(m.score for m in matched.values())
        least = _least_loaded(candidates, key)
        if longest > 0 and longest >= self.cache_threshold * len(hashes):
            holders = [c for c in candidates if matched[c.address].score == best]
            names = [c.address for c in candidates]
            limit = self.balance.share
            prefix = hashes[longest - 1]
            if limit > 0 and self.share.hot(prefix, names):
                # A prefix carrying more than one replica's worth of traffic: its requests
                # spread evenly, each to the replica under its share that took the fewest
                # of them lately (ties: least loaded), which becomes a holder if it was not
                # one. (Any other prefix stays where it is cached: a conversation's own
                # history or one group's system prompt is not worth recomputing for balance.)
                under = [c for c in candidates if not self.share.over(c.address, names, limit)]
                pick = min(
                    under or candidates,
                    key=lambda c: (
                        self.share.prefix_count_at(prefix, c.address),
                        c.view.load_tokens,
                        -rendezvous(key, c.address),
                    ),
                )
            else:
                fair = [c for c in holders if not self.share.over(c.address, names, limit)]
                pick = _least_loaded(fair or holders, key)
            if not self.balance.overloaded(pick.view, candidates):
                reason = "cache_hit" if matched[pick.address].score == best else "share"
                return _decision(pick.address, reason, matched[pick.address], longest)
            return _decision(least.address, "balance", matched[least.address], longest)
        cold = _cold_pick(candidates, key, self.balance)
        return _decision(cold.address, "cold", matched[cold.address], 0)


def _decision(address: str, reason: str, m: Match, prefix_blocks: int) -> Decision:
    return Decision(address, reason, m.blocks, prefix_blocks, m.host)


# Cold picks: replicas within this many requests (and tokens of work) of the one where this
# front door has the least of its own live work count as equally loaded, and the prompt's
# rendezvous order decides among them. Own live work is exact at every instant; the shared view
# (the last LoadReport plus what this front door routed since) is not: a report computed before
# requests another front door (or this one) sent had arrived resets what was counted since, so
# during a burst a replica that has just reported looks lighter than it is and a band on that
# view sent it whole runs of requests (radixmesh_bench/router_burst.py replays it). Each front
# door spreading its own cold traffic evenly spreads the sum evenly, however many there are.
# On an idle system (nothing live anywhere) every front door sees the same band, so a new
# prefix goes to the same replica from all of them.
COLD_BAND_REQUESTS = 1
COLD_BAND_TOKENS = 2048
# ... and within this much cache room of the roomiest: views of a replica's cache differ
# across front doors only by what each sent it in the last milliseconds (the scheduler
# publishes a queued prompt at once), so a narrow band suffices.
COLD_BAND_ROOM_TOKENS = 256


def _cold_pick(candidates: Sequence[Candidate], key: int, balance: Balance) -> Candidate:
    """Among the replicas without a backlog in the shared view (Balance.overloaded: work
    another front door sent, a slower replica), the ones about as lightly loaded with this
    front door's own live work as the least and, of those, with about as much cache room as
    the roomiest: the rendezvous winner. A new prefix goes where it evicts the least (with
    caches full of old entries all rooms are ~0 and own work decides)."""
    fair = _without_backlog(candidates, balance)
    least_requests = min(c.view.inflight_requests for c in fair)
    least_tokens = min(c.view.inflight_tokens for c in fair)
    band = [
        c
        for c in fair
        if c.view.inflight_requests <= least_requests + COLD_BAND_REQUESTS
        and c.view.inflight_tokens <= least_tokens + COLD_BAND_TOKENS
    ] or [min(fair, key=lambda c: (c.view.inflight_tokens, -rendezvous(key, c.address)))]
    roomiest = max(c.view.room_tokens for c in band)
    band = [c for c in band if c.view.room_tokens >= roomiest - COLD_BAND_ROOM_TOKENS]
    return max(band, key=lambda c: rendezvous(key, c.address))


def _least_own_work(candidates: Sequence[Candidate], key: int, balance: Balance) -> Candidate:
    """least_load: of the replicas without a backlog in the shared view, the one with the least
    of this front door's own live work (ties: the least loaded in the shared view, then the
    rendezvous order), for the reason the cold rule spreads own work (a lagging shared view
    made every front door pick the same replica during a burst)."""
    return min(
        _without_backlog(candidates, balance),
        key=lambda c: (c.view.inflight_tokens, c.view.load_tokens, -rendezvous(key, c.address)),
    )


def _without_backlog(candidates: Sequence[Candidate], balance: Balance) -> list[Candidate]:
    """The replicas without a backlog in the shared load view (all of them if none is)."""
    return [c for c in candidates if not balance.overloaded(c.view, candidates)] or list(candidates)


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
