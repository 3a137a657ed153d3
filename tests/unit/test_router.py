"""The front door's routing policy and its per-replica views (pure, no services)."""

from __future__ import annotations

import pytest

from radixmesh_wire.cache_blocks import BLOCK_TOKENS, HOST_HIT_WEIGHT, block_hashes, cache_keys
from scheduler_service.cache import prefix_cache
from tokenizer_service.routing.replica_view import Load, Match, ReplicaView
from tokenizer_service.routing.router import (
    Balance,
    Candidate,
    Policy,
    Router,
    TrafficShare,
    prompt_key,
    rendezvous,
)
from tokenizer_service.routing.traffic_share import wilson_lower


def _hashes(ids: list[int], ns: str = "") -> list[int]:
    return block_hashes(cache_keys(ids, ns))


def _exact(*held: list[int]) -> ReplicaView:
    v = ReplicaView()
    v.on_hello("inst", BLOCK_TOKENS, 1 << 20)
    for ids in held:
        v.on_cache_events(False, _hashes(ids), [])
    return v


def _loaded(view: ReplicaView, tokens: int) -> ReplicaView:
    view.on_load(Load(waiting_tokens=tokens))
    return view


SHARED = list(range(100, 164))  # 4 blocks
PROMPT = [*SHARED, *range(500, 540)]  # 6 full blocks, the first 4 shared


def test_longest_match_wins_and_says_cache_hit() -> None:
    a = _exact(SHARED[:32])  # holds 2 leading blocks
    b = _exact(SHARED)  # holds 4
    c = _exact()
    hs = _hashes(PROMPT)
    d = Router().choose(
        [Candidate("a:1", a), Candidate("b:1", b), Candidate("c:1", c)], hs, prompt_key(hs, [])
    )
    assert (d.address, d.reason, d.matched_blocks) == ("b:1", "cache_hit", 4)


def test_overloaded_holder_loses_to_the_least_loaded() -> None:
    hs = _hashes(PROMPT)
    bal = Balance(abs_tokens=100, rel=1.5)
    holder, idle = _loaded(_exact(SHARED), 1000), _loaded(_exact(), 10)
    cands = [Candidate("a:1", holder), Candidate("b:1", idle)]
    d = Router(balance=bal).choose(cands, hs, prompt_key(hs, []))
    assert (d.address, d.reason) == ("b:1", "balance")
    # Below either threshold the cache still wins: a small absolute gap ...
    holder.on_load(Load(waiting_tokens=105))
    assert Router(balance=bal).choose(cands, hs, 0).reason == "cache_hit"
    # ... or a large gap on a system that is balanced in proportion.
    holder.on_load(Load(running_tokens=10_000))
    idle.on_load(Load(running_tokens=8_000))
    assert Router(balance=bal).choose(cands, hs, 0).address == "a:1"


def test_many_short_requests_on_the_holder_overload_it_too() -> None:
    hs = _hashes(PROMPT)
    bal = Balance(abs_tokens=10_000, rel=1.5, abs_requests=4)
    holder, idle = _exact(SHARED), _exact()
    cands = [Candidate("a:1", holder), Candidate("b:1", idle)]
    idle.on_load(Load(running_requests=1, running_tokens=50))
    # Few tokens of work each, far below the token rule, but six requests against one.
    holder.on_load(Load(waiting_requests=5, running_requests=1, waiting_tokens=60))
    assert Router(balance=bal).choose(cands, hs, 0).reason == "balance"
    holder.on_load(Load(waiting_requests=4, running_requests=1, waiting_tokens=60))
    assert Router(balance=bal).choose(cands, hs, 0).reason == "cache_hit"  # a gap of 4: fine
    # Requests this front door routed since the last report count until the next one.
    holder.on_routed(hs, 10)
    assert holder.load_requests == 6
    assert Router(balance=bal).choose(cands, hs, 0).reason == "balance"
    holder.on_load(Load(waiting_requests=3))
    assert holder.load_requests == 3


def test_cold_prefixes_agree_across_routers_and_spread() -> None:
    """No replica holds anything: the first block decides by rendezvous, the same on two
    independent routers (two front doors), and different prefixes use every replica."""
    picks: dict[str, int] = {}
    for p in range(40):
        ids = [p * 1000 + i for i in range(40)]
        hs = _hashes(ids)
        views = [Candidate(f"10.0.0.{i}:5", _exact()) for i in range(3)]
        one = Router().choose(views, hs, prompt_key(hs, ids))
        other = Router().choose(list(reversed(views)), hs, prompt_key(hs, ids))
        assert one == other and one.reason == "cold"
        picks[one.address] = picks.get(one.address, 0) + 1
    assert len(picks) == 3 and min(picks.values()) >= 5


def test_cold_goes_where_this_front_door_has_the_least_live_work_beyond_a_small_band() -> None:
    ids = list(range(40))
    hs = _hashes(ids)
    views = {f"r{i}:1": _exact() for i in range(2)}
    cands = [Candidate(a, v) for a, v in views.items()]
    first = Router().choose(cands, hs, prompt_key(hs, ids)).address
    # Within the band (one live request of this front door more, a few tokens more): still the
    # rendezvous winner.
    views[first].on_routed([], 600)
    assert Router().choose(cands, hs, prompt_key(hs, ids)).address == first
    views[first].on_routed([], 600)  # two more: beyond the band
    d = Router().choose(cands, hs, prompt_key(hs, ids))
    assert d.address != first and d.reason == "cold"
    views[first].on_finished(600)
    assert Router().choose(cands, hs, prompt_key(hs, ids)).address == first
    views[first].on_routed([], 5000)  # one request, but more than the band's tokens
    assert Router().choose(cands, hs, prompt_key(hs, ids)).address != first


def test_the_shared_load_view_steers_cold_requests_only_away_from_a_backlog() -> None:
    """A replica's LoadReport lags (it may predate what this or another front door sent since),
    so a small difference in it decides nothing; a backlog (Balance.overloaded) still keeps
    new prefixes off a replica that other front doors or a slow model made busy."""
    ids = list(range(40))
    hs = _hashes(ids)
    views = {f"r{i}:1": _exact() for i in range(2)}
    cands = [Candidate(a, v) for a, v in views.items()]
    first = Router().choose(cands, hs, prompt_key(hs, ids)).address
    views[first].on_load(Load(waiting_requests=8, waiting_tokens=6000))
    assert Router().choose(cands, hs, prompt_key(hs, ids)).address == first
    views[first].on_load(Load(waiting_requests=40, waiting_tokens=20_000))
    d = Router().choose(cands, hs, prompt_key(hs, ids))
    assert d.address != first and d.reason == "cold"


def test_a_short_shared_start_is_not_a_cache_hit() -> None:
    """A system prompt every request shares must not pull every request to one replica: the
    cache decides only when a replica holds at least cache_threshold of the prompt."""
    system = list(range(16))  # one block, in every prompt
    group_a = [*system, *range(1000, 1048)]  # 4 blocks
    group_b = [*system, *range(2000, 2048)]
    holder, other = _loaded(_exact(group_a), 10), _exact()
    cands = [Candidate("a:1", holder), Candidate("b:1", other)]
    hb = _hashes(group_b)
    d = Router().choose(cands, hb, prompt_key(hb, []))
    assert (d.address, d.reason) == ("b:1", "cold")  # 1 of 4 blocks: the least loaded
    ha = _hashes([*group_a, 5])
    d = Router().choose(cands, ha, prompt_key(ha, []))
    assert (d.address, d.reason, d.matched_blocks) == ("a:1", "cache_hit", 4)
    d = Router(cache_threshold=0.0).choose(cands, hb, 0)
    assert (d.address, d.reason) == ("a:1", "cache_hit")  # any match counts at 0


def test_round_robin_cycles_in_address_order() -> None:
    r = Router(Policy.ROUND_ROBIN)
    cands = [Candidate(a, ReplicaView()) for a in ("c:1", "a:1", "b:1")]
    got = [r.choose(cands, [], 0) for _ in range(4)]
    assert [d.address for d in got] == ["a:1", "b:1", "c:1", "a:1"]
    assert {d.reason for d in got} == {"round_robin"}


def test_least_load_ignores_the_cache() -> None:
    hs = _hashes(PROMPT)
    cands = [Candidate("a:1", _loaded(_exact(SHARED), 500)), Candidate("b:1", _exact())]
    d = Router(Policy.LEAST_LOAD).choose(cands, hs, 0)
    assert (d.address, d.reason) == ("b:1", "least_load")


def test_no_candidate_is_an_error() -> None:
    with pytest.raises(ValueError):
        Router().choose([], [], 0)


def test_exact_view_follows_events_and_instance_resets() -> None:
    v = _exact(SHARED)
    hs = _hashes(PROMPT)
    assert v.matched_blocks(hs) == 4
    v.on_cache_events(False, [], [hs[2]])  # evicted block 2: the run stops there
    assert v.matched_blocks(hs) == 2
    v.on_cache_events(True, hs[:1], [])  # a reset and a snapshot
    assert v.matched_blocks(hs) == 1
    v.on_routed(hs, 100)  # routed, not yet prefilled there: followed until published
    assert v.matched_blocks(hs) == 6 and len(v.routed) == 5
    v.on_cache_events(False, hs[1:3], [])  # published: no longer only a routing record
    assert v.matched_blocks(hs) == 6 and len(v.routed) == 3
    v.on_cache_events(False, [], [hs[3]])  # evicted before or after publishing: gone
    assert v.matched_blocks(hs) == 3
    v.on_hello("inst", BLOCK_TOKENS, 1 << 20)  # same process reconnecting: kept
    assert v.matched_blocks(hs) == 3
    v.on_hello("restarted", BLOCK_TOKENS, 1 << 20)  # a new process: an empty cache
    assert v.matched_blocks(hs) == 0 and not v.routed


def test_exact_view_keeps_each_block_in_its_tier() -> None:
    """Issue 31: a block the GPU evicted to the host tier stays held, host-resident; one
    loaded back is GPU-resident again; removed or reset, it is gone from both."""
    v = _exact(PROMPT)
    hs = _hashes(PROMPT)
    room = v.room_tokens
    v.on_cache_events(False, [], [], hs[3:])  # GPU -> host: still held, no GPU room taken
    assert v.match(hs) == Match(6, 3) and v.host_blocks == 3
    assert v.room_tokens == room + 3 * BLOCK_TOKENS
    v.on_cache_events(False, hs[3:4], [hs[5]])  # one loaded back, one dropped from the host
    assert v.match(hs) == Match(5, 1) and v.host == {hs[4]}
    v.on_routed(hs, 10)  # routed: the request loads its host block, so it counts as GPU
    assert v.match(hs) == Match(6, 0)
    v.on_cache_events(True, hs[:1], [], hs[1:2])  # a snapshot: host part as listed
    assert v.match(hs) == Match(2, 1) and v.host_blocks == 1
    assert Match(2, 1).score == 1 + HOST_HIT_WEIGHT
    v.on_hello("restarted", BLOCK_TOKENS, 1 << 20)
    assert v.match(hs) == Match(0, 0) and v.host_blocks == 0


@pytest.mark.parametrize("names", [("a:1", "b:1"), ("b:1", "a:1"), ("x:9", "c:3")])
def test_a_host_resident_prefix_beats_no_match_and_loses_to_a_gpu_one(
    names: tuple[str, str],
) -> None:
    """Replica A holds the prompt's prefix in host memory. Against B holding nothing A wins
    (a copy beats a recompute), whichever way the rendezvous order of the names falls; against
    B holding it on the GPU, B wins; a longer host match beats a much shorter GPU one (the
    weight, not the tier alone, ranks them). The threshold counts blocks in either tier."""
    hs = _hashes(PROMPT)
    a_name, b_name = names

    def on_host(n: int) -> ReplicaView:
        v = _exact()
        v.on_cache_events(False, [], [], hs[:n])
        return v

    def choose(a: ReplicaView, b: ReplicaView) -> tuple[str, str, int, int]:
        d = Router().choose([Candidate(a_name, a), Candidate(b_name, b)], hs, hs[0])
        return (d.address, d.reason, d.matched_blocks, d.host_blocks)

    assert choose(on_host(6), _exact()) == (a_name, "cache_hit", 6, 6)
    # 4 of 6 blocks on the host: at or over the threshold by blocks held (score 2 < 3).
    assert choose(on_host(4), _exact()) == (a_name, "cache_hit", 4, 4)
    assert choose(on_host(6), _exact(PROMPT)) == (b_name, "cache_hit", 6, 0)
    # 6 host blocks score 6 * HOST_HIT_WEIGHT = 5.1 > 4 GPU blocks; 5 host (4.25) < 5 GPU.
    assert HOST_HIT_WEIGHT == 0.85
    assert prefix_cache.HOST_HIT_WEIGHT is HOST_HIT_WEIGHT  # the scheduler weighs it the same
    assert choose(on_host(6), _exact(PROMPT[:32]))[:2] == (a_name, "cache_hit")
    assert choose(on_host(6), _exact(SHARED))[:2] == (a_name, "cache_hit")
    assert choose(on_host(5), _exact(PROMPT[:80]))[:2] == (b_name, "cache_hit")


def test_a_burst_of_one_prefix_follows_the_first_request() -> None:
    """Requests of one prefix arriving before the replica has prefilled (and published) it
    go where the first went, instead of scattering by load; their cost there is only the
    part not held, so the token rule does not push them off. Past --balance-abs-requests
    more than the other replica, the request rule does."""

    a, b = _exact(), _exact()
    a.on_hello("a", BLOCK_TOKENS, 1 << 20)
    b.on_hello("b", BLOCK_TOKENS, 1 << 20)
    router = Router(balance=Balance(abs_requests=6, share=0))
    hs = _hashes(PROMPT)
    cands = [Candidate("a:1", a), Candidate("b:1", b)]
    first = router.choose(cands, hs, hs[0])
    views: dict[str, ReplicaView] = {"a:1": a, "b:1": b}
    views[first.address].on_routed(hs, len(PROMPT) + 16)
    for _ in range(router.balance.abs_requests):
        d = router.choose(cands, hs, hs[0])
        assert (d.address, d.reason) == (first.address, "cache_hit")
        views[d.address].on_routed(hs, 16)
    d = router.choose(cands, hs, hs[0])
    assert d.address != first.address and d.reason == "balance"


def _replicas(n: int) -> tuple[list[Candidate], dict[str, ReplicaView]]:
    views = {}
    for i in range(n):
        v = ReplicaView()
        v.on_hello(f"inst{i}", BLOCK_TOKENS, 1 << 20)
        views[f"r{i}:1"] = v
    return [Candidate(a, v) for a, v in views.items()], views


def _route(router: Router, cands: list[Candidate], prompt: list[int]) -> tuple[str, str]:
    hs = _hashes(prompt)
    d = router.choose(cands, hs, prompt_key(hs, prompt))
    view = next(c.view for c in cands if c.address == d.address)
    view.on_routed(hs, 8)
    view.on_cache_events(False, hs, [])  # prefilled and published at once
    return d.address, d.reason


def test_a_hot_prefix_spreads_until_no_replica_takes_much_more_than_its_share() -> None:
    """80 % of the traffic shares one prefix: the queues never back up (the loads stay 0), yet
    the prefix is copied to more replicas as its holders go over 1.5x an even share."""
    cands, _ = _replicas(4)
    router = Router()
    hot = list(range(100, 164))
    taken: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for i in range(200):
        tail = list(range(1000 + 40 * i, 1000 + 40 * i + 40))
        address, reason = _route(router, cands, (hot + tail) if i % 5 else tail)
        if i >= 100:  # the second half, once the shares have settled
            taken[address] = taken.get(address, 0) + 1
        reasons[reason] = reasons.get(reason, 0) + 1
    assert reasons["share"] >= 1 and "balance" not in reasons
    assert len(taken) == 4 and max(taken.values()) <= 1.5 * 100 / 4 + 3
    assert router.share.hot(_hashes(hot)[-1], [c.address for c in cands])


def test_many_prefixes_over_the_replicas_do_not_trip_the_share_rule() -> None:
    """Eight prefixes spread two per replica, their requests in a shuffled but even mix:
    every request after each prefix's first is a cache hit on the replica holding it."""
    cands, _ = _replicas(4)
    router = Router()
    prefixes = [list(range(100 + 100 * g, 164 + 100 * g)) for g in range(8)]
    order = [g for _ in range(12) for g in (0, 5, 2, 7, 1, 4, 6, 3)]
    reasons = [_route(router, cands, prefixes[g] + [9000 + i])[1] for i, g in enumerate(order)]
    assert reasons[:8].count("cold") == 8 and set(reasons[8:]) == {"cache_hit"}


def test_traffic_share_decays_and_forgets() -> None:
    share = TrafficShare(window=16)
    names = ["a", "b"]
    share.record("a", prefix=7)
    assert not share.over("a", names, 1.5)  # one decision: nothing judged yet
    assert not share.hot(7, names)  # its first decision only made it known
    share.record("a", prefix=7)
    assert share.over("a", names, 1.5) and not share.over("b", names, 1.5)
    assert not share.hot(7, names)  # 1 of 1 since: not yet confidently above a half
    for _ in range(3):
        share.record("a", prefix=7)
    assert share.hot(7, names) and not share.hot(8, names)  # ~4 of ~4 since: bound > 0.5
    assert share.prefix_count_at(7, "a") == pytest.approx(share.prefix_count(7))
    assert share.prefix_count_at(7, "b") == 0.0
    assert sum(share.counts.values()) <= 16
    for _ in range(2000):  # past a renormalization of the prefix counts
        share.record("b", prefix=8)
    assert "a" not in share.counts and share.over("b", names, 1.5)
    assert share.prefix_count(7) == 0.0 and share.prefix_count(8) == pytest.approx(16, rel=1e-6)
    assert not share.hot(7, names) and share.hot(8, names)
    assert not share.over("b", names, 0)  # 0: the rule is off


def test_wilson_lower_bound() -> None:
    assert wilson_lower(0, 0) == 0.0
    assert wilson_lower(3, 3) == pytest.approx(0.526, abs=1e-3)
    assert wilson_lower(2, 4) == pytest.approx(0.182, abs=1e-3)  # a half of few: not > 1/4
    assert wilson_lower(50, 100) == pytest.approx(0.418, abs=1e-3)


def test_a_burst_on_one_new_system_prompt_spreads_within_a_few_requests() -> None:
    """Eight conversations start at once on one system prompt (each first turn a distinct
    message after it): the prompt is hot from its third request, and the first turns spread
    over the replicas instead of all following the first one (which would leave three
    quarters of the KV idle while one replica evicts their histories)."""
    cands, _ = _replicas(4)
    router = Router()
    system = list(range(100, 164))
    got = [
        _route(router, cands, system + list(range(1000 + 32 * i, 1032 + 32 * i)))[0]
        for i in range(8)
    ]
    per = sorted((got.count(a) for a in set(got)), reverse=True)
    assert per[0] <= 3 and len(per) == 4, got  # each replica holds it once it is hot


def test_a_conversation_is_not_moved_off_its_history_by_the_share_rule() -> None:
    """One replica over its share, but the request's prefix (its own conversation so far)
    is not hot: it stays where that history is cached."""
    cands, views = _replicas(2)
    router = Router()
    system = list(range(100, 164))
    for i in range(30):  # traffic of distinct prefixes, all on r0
        router.share.record("r0:1", prefix=i)
    history = system + list(range(5000, 5064))
    views["r0:1"].on_cache_events(False, _hashes(history), [])
    d = router.choose(cands, _hashes(history + [1, 2]), 0)
    assert (d.address, d.reason) == ("r0:1", "cache_hit")


def test_approximate_view_records_routed_prompts_within_its_cap() -> None:
    v = ReplicaView(block_cap=8)
    v.on_hello("", 0, 1 << 20)  # publishes nothing
    v.on_cache_events(False, _hashes(SHARED), [])  # (ignored: not its mode)
    hs = _hashes(PROMPT)
    assert v.matched_blocks(hs) == 0
    v.on_routed(hs, 10)
    assert v.matched_blocks(hs) == 6
    other = _hashes([*SHARED, *range(900, 932)])  # shares 4 blocks, 2 new ones
    v.on_routed(other, 10)  # 8 distinct blocks: at the cap, nothing dropped yet
    assert v.matched_blocks(hs) == 6 and len(v.blocks) == 8
    v.on_routed(_hashes(list(range(2000, 2032))), 10)  # 2 more: the oldest leaves go
    assert v.matched_blocks(other) == 6  # the most recent prompt is whole
    assert v.matched_blocks(hs) == 4  # the older one lost its own tail, not the prefix
    small = ReplicaView(block_cap=1000)
    small.on_hello("", 0, 3 * BLOCK_TOKENS)  # a KV pool of 3 blocks bounds the record
    small.on_routed(hs, 1)
    assert len(small.blocks) == 3 and small.matched_blocks(hs) == 3


def test_load_is_the_report_plus_what_was_routed_since() -> None:
    v = ReplicaView()
    v.on_routed([], 100)
    v.on_routed([], 50)
    assert v.load_tokens == 150  # no report yet: own in-flight
    v.on_finished(100)
    assert v.load_tokens == 50
    v.on_load(Load(waiting_tokens=30, running_tokens=70))
    assert v.load_tokens == 100
    v.on_routed([], 25)  # a burst before the next report still counts
    assert v.load_tokens == 125


def test_namespaces_never_match_each_other() -> None:
    a = _exact()
    a.on_cache_events(False, _hashes(SHARED, "tenant-a"), [])
    assert a.matched_blocks(_hashes(SHARED, "tenant-b")) == 0
    assert a.matched_blocks(_hashes(SHARED, "tenant-a")) == 4


def test_a_cold_prefix_goes_where_the_cache_has_room_then_rendezvous_decides() -> None:
    """Equally loaded replicas: a new prefix goes to the one whose cache holds the least (it
    evicts nothing there), not to a fuller rendezvous winner; among replicas with about the
    same room, the rendezvous order decides, the same on every front door."""
    cands, views = _replicas(2)
    for v in views.values():
        v.on_hello(v.instance_id, BLOCK_TOKENS, 4096)
    prompts = [list(range(2000 + 40 * i, 2040 + 40 * i)) for i in range(64)]
    keys = {i: prompt_key(_hashes(p), p) for i, p in enumerate(prompts)}
    fav = {i: max(views, key=lambda a: rendezvous(keys[i], a)) for i in keys}
    i = next(i for i in keys if fav[i] == "r0:1")
    j = next(j for j in keys if fav[j] == "r1:1")
    assert Router().choose(cands, _hashes(prompts[i]), keys[i]).address == "r0:1"
    assert Router().choose(cands, _hashes(prompts[j]), keys[j]).address == "r1:1"
    views["r0:1"].on_cache_events(False, _hashes(list(range(9000, 9000 + 32 * 16))), [])
    d = Router().choose(cands, _hashes(prompts[i]), keys[i])  # r0 holds 512 tokens more
    assert (d.address, d.reason) == ("r1:1", "cold")
    views["r1:1"].on_cache_events(False, _hashes(list(range(7000, 7000 + 30 * 16))), [])
    assert Router().choose(cands, _hashes(prompts[i]), keys[i]).address == "r0:1"  # ~equal


def test_a_replica_whose_model_connected_after_its_session_opened_gets_cold_prefixes() -> None:
    """Its hello said capacity 0 (no model yet); its load reports carry the real one. Were the
    hello's 0 kept, it would look full and every new prefix would go to the other replica."""
    cands, views = _replicas(2)
    views["r0:1"].on_hello("inst", BLOCK_TOKENS, 4096)
    views["r1:1"].on_hello("inst", BLOCK_TOKENS, 0)
    assert views["r1:1"].room_tokens == 0
    views["r1:1"].on_load(Load(kv_capacity=4096, kv_free=4096))
    assert views["r1:1"].room_tokens == 4096
    prompts = [list(range(2000 + 40 * i, 2040 + 40 * i)) for i in range(16)]
    router = Router()
    used = {router.choose(cands, _hashes(p), prompt_key(_hashes(p), p)).address for p in prompts}
    assert used == {"r0:1", "r1:1"}


def test_a_stale_report_does_not_pull_every_front_doors_burst_to_one_replica() -> None:
    """Two front doors have each sent 10 requests to each of two replicas. Then both get r0's
    report, computed before any of them arrived (it says r0 is idle), and r1's, computed after
    all of them had (20 requests). On the shared view r0 looked 20 requests lighter, so each
    front door sent it its whole next burst (40 of 40 before the fix); each spreading its own
    live work, the burst splits evenly."""
    cost = 300
    got = {"r0:1": 0, "r1:1": 0}
    for _door in range(2):
        views = {a: _exact() for a in got}
        for v in views.values():
            for _ in range(10):
                v.on_routed([], cost)
        views["r0:1"].on_load(Load())
        views["r1:1"].on_load(Load(waiting_requests=20, waiting_tokens=20 * cost))
        router = Router()
        cands = [Candidate(a, v) for a, v in views.items()]
        for p in range(20):
            ids = [50_000 + 100 * p + i for i in range(18)]  # distinct prompts, one block each
            hs = _hashes(ids)
            d = router.choose(cands, hs, prompt_key(hs, ids))
            assert d.reason == "cold"
            views[d.address].on_routed(hs, cost)
            got[d.address] += 1
    assert abs(got["r0:1"] - got["r1:1"]) <= 4, got
