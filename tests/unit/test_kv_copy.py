"""The host tier's staged copy path (issue 31, model_service/kv_copy.py) against the plain
reference copy, bit for bit, on CPU: run splitting, chunk boundaries, both directions."""

from __future__ import annotations

import random

import pytest
import torch

from model_service.kv_copy import StagedCopier, count_runs, plan
from model_service.kv_pool import KVPool
from tests.tiny_runner import DeferredLane

LAYERS, GPU, HOST, HEADS, DIM = 3, 40, 50, 2, 4
TOKEN_BYTES = 2 * LAYERS * HEADS * DIM * 4  # float32


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """(first id, length) of each maximal run of consecutive ids, the slow obvious way."""
    out: list[tuple[int, int]] = []
    for x in ids:
        if out and out[-1][0] + out[-1][1] == x:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((x, 1))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_plan_pairs_every_slot_once_in_bounded_chunks(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(0, 60)
    host = [rng.randrange(80) for _ in range(n)] if seed % 3 else rng.sample(range(80), n)
    gpu = rng.sample(range(100), n)
    chunk, min_run = rng.randint(1, 16), rng.randint(1, 5)
    chunks = plan(host, gpu, chunk, min_run)
    pairs: list[tuple[int, int]] = []
    ordered: list[int] = []
    for c in chunks:
        assert 1 <= c.tokens <= chunk
        gather = c.gather.tolist()
        rows: list[int] = []
        at = 0
        for lo, m, row in c.runs:
            assert m >= min_run and row == at  # runs fill the staging rows in order
            rows += range(lo, lo + m)
            at += m
        assert c.gathered_at == at and at + len(gather) == c.tokens
        rows += gather
        pairs += zip(rows, c.gpu.tolist(), strict=True)
        # Inside a chunk the host slots are sorted; a run of >= min_run is never gathered.
        mine = sorted(rows)
        ordered += mine
        long = {x for lo, m in _runs(mine) if m >= min_run for x in range(lo, lo + m)}
        assert long == {x for lo, m, _ in c.runs for x in range(lo, lo + m)}
    assert sorted(pairs) == sorted(zip(host, gpu, strict=True))
    assert ordered == sorted(host)  # chunks cut the host-sorted order, nothing reordered
    assert len(chunks) == -(-n // chunk)


def test_plan_one_contiguous_run_is_one_copy_per_chunk() -> None:
    host = list(range(10, 42))
    chunks = plan(host, list(reversed(range(32))), 8, 2)
    assert [c.runs for c in chunks] == [((10 + 8 * i, 8, 0),) for i in range(4)]
    assert all(c.gather.numel() == 0 for c in chunks)
    # Descending ids (the LIFO allocator hands a freed node's slots back reversed) too.
    assert plan(list(reversed(host)), list(range(32)), 64, 2)[0].runs == ((10, 32, 0),)
    assert count_runs([5, 3, 4, 9, 10, 1]) == 3


def _pool(staged: bool, **kw: int) -> KVPool:
    gen = torch.Generator().manual_seed(0)
    p = KVPool(LAYERS, GPU, HEADS, DIM, torch.float32, "cpu")
    p.k.copy_(torch.randn(p.k.shape, generator=gen))
    p.v.copy_(torch.randn(p.v.shape, generator=gen))
    p.add_host_tier(HOST, staged=staged, **kw)
    assert p.host is not None
    p.host.copy_(torch.randn(p.host.shape, generator=gen))
    return p


def _same(a: KVPool, b: KVPool) -> None:
    assert a.host is not None and b.host is not None
    assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v) and torch.equal(a.host, b.host)


@pytest.mark.parametrize("seed", range(30))
def test_staged_copies_equal_the_reference_bit_for_bit(seed: int) -> None:
    """Random saves and loads (scattered, sorted, descending; repeated load sources) with
    random chunk and run thresholds, so runs and chunk edges fall everywhere."""
    rng = random.Random(seed)
    chunk = TOKEN_BYTES * rng.randint(1, 12)
    direct = TOKEN_BYTES * rng.randint(1, 6)
    ref, new = _pool(False), _pool(True, chunk_bytes=chunk, direct_bytes=direct)
    assert ref.copier is None and new.copier is not None
    for _ in range(6):
        n = rng.randint(1, GPU)
        gpu = rng.sample(range(GPU), n)
        if rng.random() < 0.5:
            host = rng.sample(range(HOST), n)
            if rng.random() < 0.5:
                a = rng.randrange(HOST - n + 1)
                host = list(range(a, a + n))[:: rng.choice((1, -1))]
            ref.copy(True, gpu, host)
            new.copy(True, gpu, host)
        else:
            host = [rng.randrange(HOST) for _ in range(n)]
            ref.copy(False, host, gpu)
            new.copy(False, host, gpu)
        _same(ref, new)


def test_staged_path_moves_runs_directly_and_the_rest_through_staging() -> None:
    """The shape of the work: contiguous host slots cross as one copy per chunk, scattered
    ones are gathered by the CPU in chunks; and the bytes still match the reference."""
    ref = _pool(False)
    new = _pool(True, chunk_bytes=TOKEN_BYTES * 8, direct_bytes=TOKEN_BYTES * 2)
    assert new.copier is not None and new.copier.chunk_tokens == 8
    gpu = random.Random(3).sample(range(GPU), 20)
    for p in (ref, new):
        p.copy(True, gpu, list(range(20, 40)))
    assert new.copier.last.direct_runs == 3 and new.copier.last.gathered_tokens == 0
    assert new.copier.last.chunks == 3
    host = list(range(0, 40, 2))  # every other slot: runs of 1
    for p in (ref, new):
        p.copy(False, host, gpu)
    assert new.copier.last.direct_runs == 0 and new.copier.last.gathered_tokens == 20
    _same(ref, new)


def test_the_layer_major_views_are_the_host_pool() -> None:
    p = _pool(False)
    assert p.host is not None and p.host_k is not None and p.host_v is not None
    assert p.host_k.shape == (LAYERS, HOST, HEADS, DIM)
    assert torch.equal(p.host_k[2, 7], p.host[7, 0, 2]) and torch.equal(
        p.host_v[1, 9], p.host[9, 1, 1]
    )


@pytest.mark.parametrize("staged", [False, True])
def test_copies_move_each_token_of_every_layer(staged: bool) -> None:
    """Against a token-by-token model (plain per-slot assignments on clones), so the
    reference itself is checked, not only the staged path against it."""
    p = _pool(staged, chunk_bytes=TOKEN_BYTES * 4, direct_bytes=TOKEN_BYTES * 2)
    assert p.host is not None
    k, v, host = p.k.clone(), p.v.clone(), p.host.clone()
    rng = random.Random(7)
    for to_host in (True, False, True, False):
        n = rng.randint(1, 20)
        gpu = rng.sample(range(GPU), n)
        hs = list(range(5, 5 + n)) if to_host else rng.sample(range(HOST), n)
        for g, h in zip(gpu, hs, strict=True):
            if to_host:
                host[h, 0], host[h, 1] = k[:, g], v[:, g]
            else:
                k[:, g], v[:, g] = host[h, 0], host[h, 1]
        p.copy(to_host, gpu if to_host else hs, hs if to_host else gpu)
        assert torch.equal(p.k, k) and torch.equal(p.v, v) and torch.equal(p.host, host)


def test_the_gpu_part_measures_and_proves_both_copy_paths_on_cpu() -> None:
    """host_tier_part (a) on CPU: the reference (what the CPU model service runs) and the
    staged path, each with a bit-exact round trip, runs counted, the old keys kept."""
    from radixmesh_bench.gpu.host_tier_copies import measure_copies

    c = measure_copies("tiny-llama", "cpu", True)
    tokens = c["copy_tokens"]
    for pre in ("", "cpu_staged_"):
        for name in ("scattered", "contiguous"):
            assert c[f"{pre}tier_roundtrip_exact_{name}"] is True
            assert c[f"{pre}tier_load_{name}_us_per_token"] > 0
        assert c[f"{pre}tier_contiguous_host_runs"] == 1
        assert 1 < c[f"{pre}tier_scattered_host_runs"] <= tokens
    assert c["copy_path"] == "reference" and c["cpu_staged_copy_path"] == "staged"
    moved = (
        c["cpu_staged_tier_scattered_direct_runs"],
        c["cpu_staged_tier_scattered_gathered_tokens"],
    )
    assert moved[1] > 0 and c["cpu_staged_copy_chunk_tokens"] >= 1
    assert c["tier_load_fraction_of_peak"] > 0 and c["tier_save_fraction_of_peak"] > 0


def test_the_scheduler_hands_out_host_slots_in_long_runs() -> None:
    """The staged path is fast when a copy's host slots come in runs: under a multi-turn churn
    (GPU and host LRU evictions, loads back) the scheduler's LIFO host allocator keeps a node's
    slots together (freed together, reused together), so nearly every copied token is in a run
    of 8 or more (1 MiB of 8B KV: a direct copy), counted over every KVCopy queued."""
    from scheduler_service.cache.allocator import SlotAllocator
    from scheduler_service.cache.radix_cache import RadixCache

    rng = random.Random(0)
    c = RadixCache(SlotAllocator(1500), host_capacity=3000)
    assert c.host is not None
    hist = {i: [rng.randrange(1 << 20) for _ in range(rng.randint(100, 300))] for i in range(24)}
    copied = short = loads = 0
    for _ in range(5):
        for i in rng.sample(list(hist), len(hist)):
            toks = hist[i] + [rng.randrange(1 << 20) for _ in range(rng.randint(10, 60))]
            m = c.match_prefix(toks)
            c.lock(m.node)
            if m.host_len:
                m = c.load_host(m) or m
            new = c.alloc(len(toks) - m.length)
            c.unlock(m.node)
            assert new is not None
            c.insert(toks, list(m.slots) + new)
            for cp in c.host.take_copies():
                ids = cp.dst if cp.to_host else cp.src
                loads += not cp.to_host
                copied += len(ids)
                short += sum(n for _, n in _runs(sorted(ids)) if n < 8)
            hist[i] = toks + [rng.randrange(1 << 20) for _ in range(rng.randint(20, 80))]
    assert loads > 10 and copied > 5000  # the churn happened: saves and loads both
    assert short / copied < 0.05, (short, copied)


@pytest.mark.parametrize("seed", range(30))
def test_the_ordering_rule_holds_when_copy_work_runs_late(seed: int) -> None:
    """Saves and loads (runs and gathers, host slots reused across copies) and forward-pass
    writes to the GPU pool, with the copy stream's work run as late as the copier's waits
    allow: the GPU pool matches the reference whenever the compute stream looks, the host pool
    once ``sync_host`` says it is complete."""
    rng = random.Random(seed)
    ref, new = _pool(False), _pool(False)
    lane = DeferredLane()
    assert new.host is not None
    new.copier = StagedCopier(
        new.k,
        new.v,
        new.host,
        TOKEN_BYTES * rng.randint(1, 8),
        TOKEN_BYTES * rng.randint(1, 4),
        lane=lane,
    )
    hot = list(range(10, 22))  # a small set of host slots, so copies reuse them
    for _ in range(24):
        op, n = rng.random(), rng.randint(1, 10)
        gpu = rng.sample(range(GPU), n)
        host = rng.sample(hot, n)
        if rng.random() < 0.4:  # a run (copied directly), over the hot slots
            a = rng.randrange(22 - n)
            host = list(range(a, a + n))
        if op < 0.4:
            ref.copy(True, gpu, host)
            new.copy(True, gpu, host)
        elif op < 0.8:
            ref.copy(False, host, gpu)
            new.copy(False, host, gpu)
        else:  # a forward pass writes KV into some GPU slots
            lane.main()
            vals = torch.randn(LAYERS, n, HEADS, DIM)
            for p in (ref, new):
                p.k[:, gpu] = vals
                p.v[:, gpu] = -vals
        if rng.random() < 0.5:  # the compute stream reads the pool (not after every copy)
            lane.main()
            assert torch.equal(ref.k, new.k) and torch.equal(ref.v, new.v)
    lane.main()
    new.sync_host()
    _same(ref, new)
