"""Theorem 3.1 of the SGLang paper, checked against the real policy, adder and radix cache.

Setting (the theorem's): an offline batch of prefill-only requests (``max_new_tokens = 0``),
processed one at a time (admit, compute its prompt, insert it into the cache, then the next),
with cache capacity equal to the longest request. The policy re-orders the remaining queue
before every admission, as the runtime does.

Optimum. Let T be the radix tree of the batch. Every edge's tokens must be computed at least
once, so computed >= sum(|e|) = the number of distinct non-empty prefixes in the batch, and the
paper's DFS argument shows the bound is reached. Our runtime adds one rule: a request may take
at most ``len - 1`` tokens from the cache (its last token's logits are sampled). When no prompt
is a prefix of another (and none repeats), every prompt ends at a leaf whose edge is non-empty
and belongs to that prompt alone, so its last token is new work anyway and the rule costs
nothing: the optimum stays exactly ``sum(|e|)`` and the optimal hit rate is
``1 - sum(|e|) / sum(len(prompt))``.

Without that condition the exact optimum under the rule is
``sum(|e|) + sum over nodes v of (m(v) - 1)`` for nodes where ``m(v) >= 1`` prompts end: each of
those prompts recomputes v's last token, except one processed before anything below v (pre-order
DFS achieves it). ``test_general_optimum_formula`` checks that formula by brute force over all
orders; LPM is not always optimal there (it prefers the deeper requests below v, so it can pay
one extra token per prompt ending at an internal node), which the test bounds.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.radix_cache import RadixCache
from scheduler_service.planner.policy import SchedulePolicy
from scheduler_service.planner.prefill_adder import admit_prefills
from tests.unit.queue_item import Item


def edge_sum(prompts: Sequence[Sequence[int]]) -> int:
    """Sum of the edge lengths of the batch's radix tree = number of distinct prefixes."""
    return len({tuple(p[:i]) for p in prompts for i in range(1, len(p) + 1)})


def run_offline(
    prompts: Sequence[Sequence[int]], policy: str, *, seed: int = 0
) -> tuple[int, list[int]]:
    """Process the batch one request at a time; return (computed tokens, processing order)."""
    cap = max(len(p) for p in prompts)
    cache = RadixCache(SlotAllocator(cap, debug=True))
    pol = SchedulePolicy(policy, seed=seed)
    waiting = [Item(list(p), i) for i, p in enumerate(prompts)]
    computed = 0
    order: list[int] = []
    while waiting:
        now, deferred = pol.schedule(waiting, cache)
        plan = admit_prefills(
            now, cache, chunk_budget=10**9, max_running=1, num_running=0, reserved_tokens=0
        )
        assert len(plan.admitted) == 1, plan.stop_reason
        (a,) = plan.admitted
        assert not a.chunked and a.prefix_len <= len(a.item.tokens) - 1
        computed += a.n_tokens
        cache.insert(a.item.tokens, a.match.slots + a.new_slots)  # the prompt is computed
        cache.unlock(a.match.node)
        cache.check_integrity(0)
        waiting.remove(a.item)
        order.append(a.item.arrival)
    return computed, order


def hit_rate(prompts: Sequence[Sequence[int]], computed: int) -> float:
    return 1 - computed / sum(len(p) for p in prompts)


def is_dfs_order(prompts: Sequence[Sequence[int]], order: Sequence[int]) -> bool:
    """Every subtree of the batch's trie is processed contiguously."""
    pos = {i: k for k, i in enumerate(order)}
    prefixes = {tuple(p[:j]) for p in prompts for j in range(1, len(p) + 1)}
    for pre in prefixes:
        ks = sorted(pos[i] for i, p in enumerate(prompts) if tuple(p[: len(pre)]) == pre)
        if ks[-1] - ks[0] + 1 != len(ks):
            return False
    return True


def prefix_free(raw: list[list[int]]) -> list[list[int]]:
    """Distinct prompts, none a prefix of another (arrival order = first appearance)."""
    uniq: list[tuple[int, ...]] = list(dict.fromkeys(tuple(p) for p in raw))
    keep = [p for p in uniq if not any(q != p and q[: len(p)] == p for q in uniq)]
    return [list(p) for p in keep]


@st.composite
def theorem_batches(draw: st.DrawFn) -> list[list[int]]:
    alphabet = draw(st.integers(2, 4))  # small alphabets give deep shared prefixes
    tok = st.integers(0, alphabet - 1)
    raw = draw(st.lists(st.lists(tok, min_size=1, max_size=14), min_size=1, max_size=14))
    return prefix_free(raw)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(theorem_batches())
def test_lpm_reaches_optimal_hit_rate(prompts: list[list[int]]) -> None:
    computed, order = run_offline(prompts, "lpm")
    assert computed == edge_sum(prompts)
    assert hit_rate(prompts, computed) == 1 - edge_sum(prompts) / sum(map(len, prompts))
    assert is_dfs_order(prompts, order)  # "longest-shared-prefix-first is a DFS order"


def brute_force_optimum(prompts: Sequence[Sequence[int]]) -> int:
    """Min computed tokens over every processing order (FCFS over permuted arrivals)."""
    best = None
    for perm in itertools.permutations(prompts):
        computed, _ = run_offline(list(perm), "fcfs")
        best = computed if best is None else min(best, computed)
    assert best is not None
    return best


@settings(max_examples=40, deadline=None)
@given(theorem_batches().filter(lambda b: len(b) <= 5))
def test_edge_sum_is_the_optimum(prompts: list[list[int]]) -> None:
    # The lower bound is tight for our cache mechanics too, not only in the paper's model.
    assert brute_force_optimum(prompts) == edge_sum(prompts)


def general_optimum(prompts: Sequence[Sequence[int]]) -> int:
    ends: dict[tuple[int, ...], int] = {}
    for p in prompts:
        ends[tuple(p)] = ends.get(tuple(p), 0) + 1
    return edge_sum(prompts) + sum(m - 1 for m in ends.values())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=6), min_size=1, max_size=5))
def test_general_optimum_formula(prompts: list[list[int]]) -> None:
    # Outside the theorem's condition (repeats, prompts that prefix others) the one-token rule
    # adds sum(m(v) - 1); LPM may pay one more per prompt ending at an internal node.
    opt = general_optimum(prompts)
    assert brute_force_optimum(prompts) == opt
    lpm, _ = run_offline(prompts, "lpm")
    distinct = {tuple(p) for p in prompts}
    internal = sum(
        1 for p in prompts if any(q != tuple(p) and q[: len(p)] == tuple(p) for q in distinct)
    )
    assert opt <= lpm <= opt + internal


def interleaved_groups(groups: int = 2, per_group: int = 4, prefix: int = 40, suffix: int = 8):
    """Groups with distinct long prefixes arriving interleaved A, B, A, B, ...; the cache (the
    longest request) holds one group's prefix at a time."""
    rng = random.Random(7)
    heads = [[1000 * (g + 1) + i for i in range(prefix)] for g in range(groups)]
    prompts = []
    for k in range(per_group):
        for g in range(groups):
            tail = [rng.randrange(10**6) + 10**7 * (k + 1) for _ in range(suffix)]
            prompts.append(heads[g] + tail)
    return prompts


def test_fcfs_and_random_fall_short_on_interleaved_batches() -> None:
    prompts = interleaved_groups()
    opt = edge_sum(prompts)
    assert opt == 2 * 40 + 8 * 8
    assert run_offline(prompts, "lpm")[0] == opt
    assert run_offline(prompts, "dfs-weight")[0] == opt
    fcfs, _ = run_offline(prompts, "fcfs")
    assert fcfs == sum(map(len, prompts))  # thrashing: every request recomputes its prefix
    assert hit_rate(prompts, fcfs) == 0.0 < hit_rate(prompts, opt)
    for seed in range(5):
        rnd, order = run_offline(prompts, "random", seed=seed)
        assert rnd > opt, (seed, order)


def test_three_groups_lpm_optimal_fcfs_not() -> None:
    prompts = interleaved_groups(groups=3, per_group=3, prefix=25, suffix=5)
    opt = edge_sum(prompts)
    assert run_offline(prompts, "lpm")[0] == opt
    assert run_offline(prompts, "fcfs")[0] > opt
