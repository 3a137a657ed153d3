"""What one front door knows about one replica (scheduler + model): which prefix-cache blocks
it holds and how loaded it is. Pure bookkeeping, no I/O and no protobuf: the link turns the
scheduler's hello, CacheEvents and LoadReport into the calls below.

Two ways to know the blocks (radixmesh_wire.cache_blocks: chained hashes of 16-key blocks):
- exact: the scheduler publishes its radix cache's inserts and evictions (hello says
  `cache_block_tokens > 0`); `blocks` mirrors them. A reset (a new session's snapshot, or a
  new `instance_id`: the process restarted with an empty cache) drops everything first.
  With a host KV tier (issue 31) a block is GPU-resident or host-resident (evicted from the GPU
  but kept in host memory: the replica serves it with a copy, not a recompute); `host` is the
  subset of `blocks` held in host memory only, and `match` tells how many of a prompt's
  leading blocks are host-resident so the router can weigh them (HOST_HIT_WEIGHT).
  A prompt routed here is cached only once its prefill has run, so its blocks are also kept
  in `routed` (a small LRU) until the replica publishes them (or evicts them): requests of the
  same prefix that arrive meanwhile (a burst) follow the first instead of scattering.
- approximate (the scheduler publishes nothing): the blocks of the prompts this front door
  routed there, as SGLang's router guesses. Bounded by an LRU of `block_cap` blocks (and never
  more blocks than the replica's KV could hold). A prompt's blocks are touched deepest first,
  so a prefix is never older than its extensions and eviction drops leaves first.

Load, in tokens of work left (prompt still to prefill, a prefix shared by waiting requests
once, + output budgets still to generate) and in requests (waiting + running): the last
LoadReport plus what this front door routed there since (so a burst does not all land on one
replica before the next report). Without any report, this front door's own in-flight tokens
and requests there. Those (`inflight_*`: this front door's requests there that have not ended)
are exact at every instant, unlike a report that predates what was sent since: the cold rule
and least_load spread them (router.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from radixmesh_wire.cache_blocks import BLOCK_TOKENS, HOST_HIT_WEIGHT


@dataclass(frozen=True)
class Load:
    """One LoadReport, as plain numbers."""

    waiting_requests: int = 0
    running_requests: int = 0
    waiting_tokens: int = 0
    running_tokens: int = 0
    kv_capacity: int = 0
    kv_free: int = 0
    cache_hit_rate: float = 0.0

    @property
    def tokens(self) -> int:
        return self.waiting_tokens + self.running_tokens

    @property
    def requests(self) -> int:
        return self.waiting_requests + self.running_requests


@dataclass(frozen=True)
class Match:
    """A prompt's leading blocks a replica holds, `host` of them in host memory only."""

    blocks: int = 0
    host: int = 0

    @property
    def score(self) -> float:
        """What the match is worth, in GPU-resident blocks: a host-resident block counts
        HOST_HIT_WEIGHT (cheaper than recomputing it, dearer than a GPU hit)."""
        return self.blocks - self.host * (1.0 - HOST_HIT_WEIGHT)


class ReplicaView:
    def __init__(self, block_cap: int = 65536) -> None:
        self.block_cap = block_cap
        self.exact = False  # blocks come from the replica's own CacheEvents
        self.instance_id = ""
        self.kv_capacity = 0
        # Held blocks; in approximate mode the order is recency (oldest first).
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.host: set[int] = set()  # exact mode: of `blocks`, those in host memory only
        # Exact mode: blocks of prompts routed here that the replica has not published yet.
        self.routed: OrderedDict[int, None] = OrderedDict()
        self.reported: Load | None = None
        self.pending_tokens = 0  # routed here since the last report
        self.pending_requests = 0
        self.inflight_tokens = 0  # this front door's live requests here
        self.inflight_requests = 0

    # --- the replica's own messages

    def on_hello(self, instance_id: str, block_tokens: int, kv_capacity: int) -> None:
        """A (re)connected session. A new instance is a new process: nothing of the old one's
        cache or load survives. A scheduler whose blocks are not ours publishes nothing we
        can use: stay approximate."""
        exact = block_tokens == BLOCK_TOKENS
        if instance_id != self.instance_id or exact != self.exact:
            self.blocks.clear()
            self.host.clear()
            self.routed.clear()
            self.reported = None
            self.pending_tokens = self.pending_requests = 0
        self.instance_id = instance_id
        self.exact = exact
        self.kv_capacity = kv_capacity

    def on_cache_events(
        self,
        reset: bool,
        added: Iterable[int],
        removed: Iterable[int],
        host: Iterable[int] = (),
    ) -> None:
        """`added`: GPU-resident now; `host`: host-resident now; `removed`: held in neither."""
        if not self.exact:
            return
        blocks, routed, on_host = self.blocks, self.routed, self.host
        if reset:
            blocks.clear()
            routed.clear()
            on_host.clear()
        for h in removed:
            blocks.pop(h, None)
            routed.pop(h, None)
            on_host.discard(h)
        for h in added:
            blocks[h] = None
            routed.pop(h, None)
            on_host.discard(h)
        for h in host:
            blocks[h] = None
            routed.pop(h, None)
            on_host.add(h)

    def on_load(self, load: Load) -> None:
        self.reported = load
        if load.kv_capacity:
            # The hello's capacity is 0 when the session opened before the replica's model
            # connected, and a model may come back with another pool: the report is current.
            self.kv_capacity = load.kv_capacity
        self.pending_tokens = self.pending_requests = 0

    # --- this front door's own traffic

    def on_routed(self, hashes: Sequence[int], cost: int) -> None:
        self.pending_tokens += cost
        self.inflight_tokens += cost
        self.pending_requests += 1
        self.inflight_requests += 1
        if not hashes:
            return
        record = self.routed if self.exact else self.blocks
        on_host = self.host
        for h in reversed(hashes):  # deepest first: the prefix ends up the most recent
            if self.exact and h in self.blocks and h not in on_host:
                continue  # on the GPU there already (a host block will be loaded: routed)
            if h in record:
                record.move_to_end(h)
            else:
                record[h] = None
        cap = self.approx_cap
        while len(record) > cap:
            record.popitem(last=False)

    def on_finished(self, cost: int) -> None:
        """A request routed here left (finished, aborted, or moved to another replica)."""
        self.inflight_tokens = max(self.inflight_tokens - cost, 0)
        self.inflight_requests = max(self.inflight_requests - 1, 0)

    # --- what the router reads

    @property
    def approx_cap(self) -> int:
        if self.kv_capacity:
            return max(min(self.block_cap, self.kv_capacity // BLOCK_TOKENS), 1)
        return max(self.block_cap, 1)

    def matched_blocks(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt this replica holds, in either tier."""
        return self.match(hashes).blocks

    def match(self, hashes: Sequence[int]) -> Match:
        """The leading blocks of a prompt this replica holds, and how many of them are in host
        memory only (a block just routed here counts as GPU-resident: its request computes or
        loads it)."""
        n = on_host = 0
        blocks, routed, host = self.blocks, self.routed, self.host
        for h in hashes:
            if h in routed:
                pass
            elif h in blocks:
                if h in host:
                    on_host += 1
            else:
                break
            n += 1
        return Match(n, on_host)

    @property
    def host_blocks(self) -> int:
        """Blocks it holds in host memory only (exact mode)."""
        return len(self.host)

    @property
    def room_tokens(self) -> int:
        """GPU KV this replica's cache does not hold yet, as far as this front door knows (its
        capacity less the GPU-resident blocks it holds or was just sent; host-resident ones
        take no GPU room); 0 with no known capacity."""
        held = (len(self.blocks) - len(self.host) + len(self.routed)) * BLOCK_TOKENS
        return max(self.kv_capacity - held, 0)

    @property
    def load_tokens(self) -> int:
        if self.reported is None:
            return self.inflight_tokens
        return self.reported.tokens + self.pending_tokens

    @property
    def load_requests(self) -> int:
        """Requests waiting or running there, the same way: report + routed since, or own."""
        if self.reported is None:
            return self.inflight_requests
        return self.reported.requests + self.pending_requests
