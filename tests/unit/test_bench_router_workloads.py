"""`radixmesh bench router`'s workloads: exact token counts, the sharing structure each one
promises (checked on the scheduler's own 16-token block hashes, which the cache-aware router
routes on), determinism, and the size presets and overrides."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from radixmesh_bench.radix_workloads import lcp, optimal_hit_rate
from radixmesh_bench.router_workloads import (
    ID_RANGE,
    SCALES,
    WORKLOADS,
    Sizes,
    build,
    chat,
    few_shot,
    gsp,
    sizes_for,
    skewed,
    uniform,
)
from radixmesh_wire.cache_blocks import BLOCK_TOKENS, block_hashes, cache_keys

S = sizes_for(
    "small",
    gsp_groups=3,
    gsp_questions=5,
    gsp_system_tokens=40,
    gsp_question_tokens=7,
    chat_conversations=3,
    chat_turns=4,
    chat_system_tokens=20,
    chat_turn_tokens=9,
    few_shot_shots=3,
    few_shot_shot_tokens=11,
    few_shot_questions=6,
    few_shot_question_tokens=5,
    uniform_requests=12,
    uniform_tokens=33,
    skewed_requests=20,
    skewed_hot_fraction=0.75,
    skewed_prefix_tokens=48,
    skewed_suffix_tokens=8,
    max_new_tokens=3,
)


def blocks(ids: list[int]) -> list[int]:
    return block_hashes(cache_keys(ids, ""))


def test_gsp_groups_share_exactly_their_system_prompt() -> None:
    w = gsp(S, seed=1)
    assert len(w.prompts) == 15 and w.max_new == 3
    assert all(len(p) == 40 + 7 for p in w.prompts)
    assert all(ID_RANGE[0] <= t < ID_RANGE[1] for p in w.prompts for t in p)
    systems = Counter(tuple(p[:40]) for p in w.prompts)
    assert sorted(systems.values()) == [5, 5, 5]
    assert len({tuple(p[40:]) for p in w.prompts}) == 15  # every question distinct
    for a, b in itertools.combinations(w.prompts, 2):
        same = a[:40] == b[:40]
        # 40 shared tokens are 2 whole blocks; different groups share no block at all
        shared = lcp(blocks(a), blocks(b))
        assert shared == (40 // BLOCK_TOKENS if same else 0)
    # Arrivals are shuffled across groups (not 5 of one group, then 5 of the next).
    firsts = [tuple(p[:40]) for p in w.prompts]
    assert any(firsts[i] != firsts[i + 1] for i in range(4))


def test_chat_turns_extend_the_previous_prompt_and_answer() -> None:
    w = chat(S, seed=2)
    assert w.is_chat and len(w.sessions) == 3
    prompts, full = w.planned()
    assert len(prompts) == 3 * 4
    system = w.sessions[0][0][:20]
    for s in range(3):
        turns = prompts[s * 4 : (s + 1) * 4]
        full_turns = full[s * 4 : (s + 1) * 4]
        assert turns[0][:20] == system and len(turns[0]) == 20 + 9
        for k in range(1, 4):
            # prompt k = prompt k-1 + its answer (max_new tokens) + a new user message
            assert turns[k][: len(full_turns[k - 1])] == full_turns[k - 1]
            assert len(turns[k]) == len(turns[k - 1]) + 3 + 9
    # Conversations share the system prompt and nothing after it.
    firsts = [sess[0] for sess in w.sessions]
    assert all(lcp(a, b) == 20 for a, b in itertools.combinations(firsts, 2))


def test_few_shot_shares_one_block_of_shots() -> None:
    w = few_shot(S, seed=3)
    assert len(w.prompts) == 6
    assert all(len(p) == 3 * 11 + 5 for p in w.prompts)
    assert len({tuple(p[:33]) for p in w.prompts}) == 1
    assert len({tuple(p[33:]) for p in w.prompts}) == 6
    # Offline optimum: everything but the first copy of the block is reusable (cap len-1).
    opt = optimal_hit_rate(w.prompts, w.prompts)
    assert opt["optimal_cached_tokens"] == 5 * 33


def test_uniform_prompts_share_no_block() -> None:
    w = uniform(S, seed=4)
    assert len(w.prompts) == 12 and all(len(p) == 33 for p in w.prompts)
    for a, b in itertools.combinations(w.prompts, 2):
        assert lcp(blocks(a), blocks(b)) == 0


def test_skewed_has_one_hot_prefix_and_distinct_cold_prompts() -> None:
    w = skewed(S, seed=5)
    assert len(w.prompts) == 20 and all(len(p) == 48 + 8 for p in w.prompts)
    heads = Counter(tuple(p[:48]) for p in w.prompts)
    (hot, n_hot), *rest = heads.most_common()
    assert n_hot == 15 and all(n == 1 for _, n in rest) and len(rest) == 5
    cold = [p for p in w.prompts if tuple(p[:48]) != hot]
    assert all(lcp(blocks(p), blocks(list(hot))) == 0 for p in cold)


def test_workloads_are_deterministic_and_independent_of_each_other() -> None:
    a = build(["gsp", "uniform"], S, seed=7)
    b = build(["uniform"], S, seed=7)
    assert a[1].prompts == b[0].prompts
    assert build(["gsp"], S, seed=7)[0].prompts == a[0].prompts
    assert build(["gsp"], S, seed=8)[0].prompts != a[0].prompts
    assert [w.name for w in build(list(WORKLOADS), S)] == list(WORKLOADS)
    with pytest.raises(ValueError, match="unknown workload 'gpt'"):
        build(["gpt"], S)


def test_sizes_presets_and_overrides() -> None:
    assert set(SCALES) == {"small", "medium", "large"}
    assert sizes_for("medium", gsp_groups=None).gsp_groups == SCALES["medium"].gsp_groups
    assert sizes_for("small", gsp_groups=9).gsp_groups == 9
    with pytest.raises(ValueError, match="unknown scale"):
        sizes_for("huge")
    with pytest.raises(ValueError, match="gsp_groups must not be negative"):
        sizes_for("small", gsp_groups=-1)
    with pytest.raises(ValueError, match="skewed_hot_fraction"):
        sizes_for("small", skewed_hot_fraction=1.5)
    with pytest.raises(ValueError, match="chat_turns"):
        sizes_for("small", chat_turns=0)
    assert isinstance(SCALES["large"], Sizes)
