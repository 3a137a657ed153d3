"""The host-memory KV tier end to end (issue 31), on real processes, CPU reference path.

Two stacks, started once for this module:
- ``tier``: a GPU pool of 256 KV tokens, far too small for the workload, with a host tier of
  2048 tokens on both the model service and the scheduler, ``--debug-invariants`` (the
  accounting of both tiers is checked after every step; a violation ends the scheduler) and
  ``--nan-fill`` (freed GPU slots are poisoned with NaN: a save that read a slot after it was
  poisoned, or a poisoned load, would show up in the outputs);
- ``tier_wt``: the same with ``--host-tier-write write_through`` (finished requests' KV copied
  to the host at once; eviction then copies nothing), for the token-identity test only;
- ``big``: 8192 KV tokens and no host tier: nothing is ever evicted (the reference).

The workload: five conversations of about 100-token histories, turns interleaved, so every
returning turn finds its history evicted from the small GPU pool (five histories are twice
its size). With the tier, each returning turn's history is loaded back from host memory.

Cache events by tier: a prompt pushed out of the GPU pool stays published, host-resident, to a
new front-door session and in the front door's own view of the replica.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from radixmesh.api import Client, GenerateResult

from radixmesh_bench.radix_texts import GEOGRAPHY_QUESTIONS, NO_REUSE_SENTENCES
from radixmesh_wire.cache_blocks import block_hashes
from radixmesh_wire.pb import scheduler_pb2, scheduler_pb2_grpc
from tests.conftest import Stack, start_stack

pytestmark = pytest.mark.integration

GPU_KV, HOST_KV, BIG_KV = 256, 2048, 8192
TIMEOUT = 120.0
CONVERSATIONS, TURNS, NEW = 5, 3, 8


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("host-tier"),
        ["--kv-tokens", str(GPU_KV), "--host-kv-tokens", str(HOST_KV), "--nan-fill"],
        ["--radix", "tree", "--debug-invariants", "--host-kv-tokens", str(HOST_KV)],
    )


@pytest.fixture(scope="module")
def tier_wt(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("host-tier-wt"),
        ["--kv-tokens", str(GPU_KV), "--host-kv-tokens", str(HOST_KV), "--nan-fill"],
        [
            "--radix",
            "tree",
            "--debug-invariants",
            "--host-kv-tokens",
            str(HOST_KV),
            "--host-tier-write",
            "write_through",
        ],
    )


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("host-tier-big"),
        ["--kv-tokens", str(BIG_KV)],
        ["--radix", "tree"],
    )


def _greedy(c: Client, ids: list[int]) -> GenerateResult:
    r = c.generate(
        input_ids=ids, max_new_tokens=NEW, temperature=0, ignore_eos=True, return_logprob=True
    )
    assert r.completion_tokens == NEW and r.finish_reason == "length"
    return r


def _run(c: Client) -> list[GenerateResult]:
    """Every conversation's turn 1, then every turn 2, ... (interleaved); each turn's prompt is
    the previous turn's prompt and answer plus a new question."""
    k = len(NO_REUSE_SENTENCES) // CONVERSATIONS
    history = [
        c.tokenize(" ".join(NO_REUSE_SENTENCES[i * k : (i + 1) * k])) for i in range(CONVERSATIONS)
    ]
    out = []
    for turn in range(TURNS):
        for i in range(CONVERSATIONS):
            q = GEOGRAPHY_QUESTIONS[(turn * CONVERSATIONS + i) % len(GEOGRAPHY_QUESTIONS)]
            prompt = history[i] + c.tokenize(f"\nQuestion: {q}\nAnswer:")
            r = _greedy(c, prompt)
            history[i] = prompt + r.output_ids
            out.append(r)
    return out


@pytest.fixture(scope="module")
def want(big: Stack) -> list[GenerateResult]:
    """The workload on the unlimited pool (the reference for both write policies)."""
    with Client(big.endpoint, timeout=TIMEOUT) as b:
        return _run(b)


def _scheduler_metric(stack: Stack, name: str, service: str = "scheduler") -> float:
    """One sample of the scheduler's /metrics (the write policy's counters are not in
    GetStats), or of another service's; ``name`` may carry labels (``x{direction="load"}``)."""
    assert stack.metrics_ports is not None
    port = getattr(stack.metrics_ports, service)
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    base, _, labels = name.partition("{")
    labels = "{" + labels if labels else ""
    for line in text.splitlines():
        if line.startswith((f"radixmesh_{base}{labels} ", f"radixmesh_{base}_total{labels} ")):
            return float(line.split()[-1])
    raise AssertionError(f"radixmesh_{name} not in the {service}'s /metrics")


@pytest.mark.parametrize("stack", ["tier", "tier_wt"])
def test_host_tier_serves_evicted_history_with_identical_tokens(
    stack: str, want: list[GenerateResult], request: pytest.FixtureRequest
) -> None:
    tier: Stack = request.getfixturevalue(stack)
    with Client(tier.endpoint, timeout=TIMEOUT) as t:
        got = _run(t)
        stats = t.stats()
    assert sum(len(r.output_ids) for r in got) == CONVERSATIONS * TURNS * NEW
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.output_ids == w.output_ids, f"request {i}: tokens differ with the host tier"
        worst = max(
            abs(p.logprob - q.logprob)
            for p, q in zip(g.output_logprobs, w.output_logprobs, strict=True)
        )
        assert worst < 1e-3, f"request {i}: logprobs differ by {worst}"
        # Every returning turn reuses its whole history, as with the unlimited pool.
        assert g.cached_tokens == w.cached_tokens, f"request {i}"
    returning = got[CONVERSATIONS:]
    assert all(r.cached_tokens > 100 for r in returning)
    # The GPU pool cannot hold five histories: the hits came back from host memory.
    assert stats.host_kv_capacity == HOST_KV
    assert stats.host_hit_tokens > 0 and stats.host_saved_tokens > 0
    assert stats.host_loaded_tokens == stats.host_hit_tokens
    assert stats.evicted_tokens > 0
    assert 0 < stats.host_kv_used <= HOST_KV
    # Prefill computed exactly what the unlimited pool computed.
    computed = stats.prompt_tokens - stats.cached_prompt_tokens
    assert computed == sum(r.prompt_tokens - r.cached_tokens for r in want)
    assert stats.kv_locked == 0 and stats.kv_request_owned == 0
    through = _scheduler_metric(tier, "host_written_through_tokens")
    if stack == "tier_wt":  # the saves were write-through copies, not eviction's
        assert through > 0 and through >= stats.host_saved_tokens * 0.5
    else:
        assert through == 0
    # Load-ahead: every host hit joined a batch the step after its load; no step's forward
    # pass had to wait for its own loads (the model service counts any that did).
    assert _scheduler_metric(tier, "host_load_waits") > 0
    assert _scheduler_metric(tier, "kv_loads_waited_in_step", "model") == 0
    # The model service counted the loads the scheduler sent, token for token.
    loaded = _scheduler_metric(tier, 'kv_copy_tokens{direction="load"}', "model")
    assert loaded == stats.host_loaded_tokens
    assert _scheduler_metric(tier, 'kv_copies{direction="load"}', "model") > 0
    saved = _scheduler_metric(tier, 'kv_copy_tokens{direction="save"}', "model")
    assert 0 < saved <= stats.host_saved_tokens  # a queued save waits for the next step


def test_cancel_after_a_host_hit_frees_both_tiers(tier: Stack) -> None:
    with Client(tier.endpoint, timeout=TIMEOUT) as c:
        before = c.stats()
        # Push the first conversation's history out of the GPU pool, then resume it.
        _run_other(c)
        first = c.tokenize(" ".join(NO_REUSE_SENTENCES[: len(NO_REUSE_SENTENCES) // 5]))
        it = c.stream(
            input_ids=first + c.tokenize("\nQuestion: Why?\nAnswer:"),
            max_new_tokens=120,
            ignore_eos=True,
            request_id="host-tier-cancel",
        )
        next(it)
        assert c.abort("host-tier-cancel")
        final = [x for x in it if isinstance(x, GenerateResult)][0]
        assert final.finish_reason == "abort" and final.cached_tokens > 0
        _greedy(c, c.tokenize("A last short request."))  # its completion follows the reap
        s = c.stats()
    assert s.host_hit_tokens > before.host_hit_tokens  # the cancelled request hit the host
    assert s.running_requests == 0 and s.kv_locked == 0 and s.kv_request_owned == 0
    assert s.kv_free + s.kv_evictable == s.kv_capacity
    assert s.host_kv_used <= s.host_kv_capacity


def _run_other(c: Client) -> None:
    """Three unrelated 100-token requests: more than the GPU pool holds besides."""
    for i in range(3):
        _greedy(c, c.tokenize(f"Story {i}: " + " ".join(NO_REUSE_SENTENCES[i * 6 + 3 : i * 6 + 9])))


def test_a_prefix_evicted_to_the_host_stays_advertised_host_resident(tier: Stack) -> None:
    """A finished prompt's blocks, pushed out of the GPU pool by unrelated requests, are still
    published: a new front-door session's snapshot lists them as host-resident (`host`, not
    `added`; before issue 31's tiered events they were removed), and the front door's view of
    the replica counts them (GetStats' `cached_host_blocks`)."""
    with Client(tier.endpoint, timeout=TIMEOUT) as c:
        prompt = c.tokenize("Routing note: " + " ".join(NO_REUSE_SENTENCES[-8:]))
        _greedy(c, prompt)
        _run_other(c)  # more than the GPU pool holds besides: the prompt goes to the host
        s = c.stats()
    blocks = set(block_hashes(prompt))
    assert len(blocks) >= 4 and s.host_saved_tokens > 0
    snapshot = asyncio.run(_opening_snapshot(tier))
    assert snapshot.reset
    assert blocks <= set(snapshot.host), "evicted prompt not advertised host-resident"
    assert not blocks & set(snapshot.added)
    replica = s.replicas[0]
    assert replica.exact_cache and replica.cached_host_blocks >= len(blocks)
    assert replica.cached_blocks >= replica.cached_host_blocks


async def _opening_snapshot(stack: Stack) -> scheduler_pb2.CacheEvents:
    """The cache events a new front-door session opens with: the scheduler's published state."""
    done = asyncio.Event()

    async def outgoing() -> AsyncIterator[scheduler_pb2.FrontendMessage]:
        hello = scheduler_pb2.FrontendHello(session_id="host-tier-events")
        yield scheduler_pb2.FrontendMessage(hello=hello)
        await done.wait()

    async with stack.channel_as("scheduler", "tokenizer") as chan:
        call = scheduler_pb2_grpc.SchedulerStub(chan).Session(outgoing())
        try:
            first = await call.read()
            assert first.HasField("hello") and first.hello.cache_block_tokens > 0
            opening = await call.read()
            assert opening.HasField("cache")
            return opening.cache
        finally:
            done.set()
            call.cancel()


@pytest.mark.slow
def test_gpu_part_host_tier_runs_on_cpu_tiny(tmp_path: Path) -> None:
    """The GPU part `host_tier` (radixmesh_bench/gpu/host_tier_part.py) end to end in its tiny
    configuration (tiny-llama on CPU, its own stack): every run completes, the tier serves
    hits from the host only when on (and prefill computes less), write-through copies what
    write-back would save at eviction, the copy rates and the host-hit weight are computed."""
    import json

    from radixmesh_bench.gpu.host_tier_part import part_host_tier

    # Two of the three tier settings (write-back runs the same loop with another flag): CI time.
    tiny = ["--model", "tiny-llama", "--device", "cpu", "--quick", "--tiers", "off,write_through"]
    ok = part_host_tier(tmp_path, tiny)
    doc = json.loads((tmp_path / "host_tier.json").read_text())
    assert ok, doc["errors"]
    rows = {(r["workload"], r["tier"]): r for r in doc["rows"]}
    assert set(rows) == {(w, t) for w in ("multi_turn", "gsp") for t in ("off", "write_through")}
    for (workload, tier), r in rows.items():
        assert r["all_complete"], (workload, tier)
        if tier == "off":
            assert r["host_hit_tokens"] == 0 and r["saved_tokens"] == 0
        else:  # prefixes over the GPU pool come back from the host
            assert r["host_hit_tokens"] > 0 and r["loaded_tokens"] == r["host_hit_tokens"]
            assert r["prefill_tokens_computed"] < rows[(workload, "off")]["prefill_tokens_computed"]
            # The model service's own copy counters (its /metrics): time and rate of the loads.
            assert r["copy_s_load"] > 0 and r["copied_GBps_load"] > 0, (workload, r)
        through = r["written_through_tokens"]  # a node evicted before its turn: write-back
        if tier == "write_through":
            assert 0 < through <= r["saved_tokens"], (workload, r)
        else:
            assert through == 0, (workload, tier)
    c = doc["copies"]
    assert c["link_h2d_GBps"] > 0 and c["tier_load_scattered_GBps"] > 0
    assert 0 <= doc["host_hit_weight_measured"] <= 1
    assert doc["prefill"]["prefill_s_per_token"] > 0
