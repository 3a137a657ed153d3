"""RadixAttention end to end, on real processes (issue 3).

Three stacks, started together once for this module, each with its own small KV pool:
- ``tree``  : ``--radix tree --debug-invariants``, 4096 KV tokens (roomy: nothing is evicted);
- ``off``   : ``--radix off --max-queue 2 --max-running 1``, 1024 KV tokens: the no-cache,
  one-at-a-time reference, and the full-queue check;
- ``tight`` : ``--radix tree --debug-invariants --new-token-ratio 0``, 600 KV tokens: eviction
  and retraction under pressure (admission reserves nothing for future decodes, so it packs the
  pool with prompts and the decodes of the 16 concurrent requests usually must retract some;
  at 0.1, where the decaying ratio settles on a server that has run a while, one run in five
  needed none, so the test runs the workload up to three times until one does).

Numerics rule for two runs of our own stack (as in test_concurrency): identical greedy tokens up
to a first difference, accepted only where earlier chosen-token logprobs already differ by more
than 1e-4.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from radixmesh.api import Client, GenerateResult, RadixMeshError

from radixmesh_bench.radix_texts import (
    CHEMISTRY_QUESTIONS,
    CHEMISTRY_SHOTS,
    GEOGRAPHY_QUESTIONS,
    GEOGRAPHY_SHOTS,
    NO_REUSE_SENTENCES,
    TOT_APPROACHES,
    TOT_PROBLEMS,
    few_shot_prefix,
)
from radixmesh_bench.radix_workloads import lcp
from tests.conftest import Stack, start_stack

pytestmark = pytest.mark.integration

TREE_KV, OFF_KV, TIGHT_KV = 4096, 1024, 600
STACKS = {
    "tree": (["--kv-tokens", str(TREE_KV)], ["--radix", "tree", "--debug-invariants"]),
    "off": (
        ["--kv-tokens", str(OFF_KV)],
        ["--radix", "off", "--max-queue", "2", "--max-running", "1"],
    ),
    "tight": (
        ["--kv-tokens", str(TIGHT_KV)],
        ["--radix", "tree", "--debug-invariants", "--new-token-ratio", "0"],
    ),
}
TIMEOUT = 120.0  # per request: a hang fails the test instead of the whole run


class _HeldStack(threading.Thread):
    """Starts one stack and stays alive until told to stop it: services get SIGTERM when the
    thread that started them exits (PR_SET_PDEATHSIG), so the starting thread must outlive the
    stack. One such thread per stack lets the three stacks start (and stop) in parallel."""

    def __init__(self, tmp: Path, model_args: list[str], sched_args: list[str]) -> None:
        super().__init__(daemon=True)
        self.args = (tmp, model_args, sched_args)
        self.up = threading.Event()
        self.stop = threading.Event()
        self.stack: Stack | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        gen = start_stack(*self.args)
        try:
            self.stack = next(gen)
        except BaseException as exc:  # noqa: BLE001 - reported by the fixture
            self.error = exc
            self.up.set()
            return
        self.up.set()
        self.stop.wait()
        gen.close()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[dict[str, Stack]]:
    held = {
        name: _HeldStack(tmp_path_factory.mktemp(f"radix-{name}"), m, s)
        for name, (m, s) in STACKS.items()
    }
    for h in held.values():
        h.start()
    try:
        up: dict[str, Stack] = {}
        for name, h in held.items():
            h.up.wait()
            if h.error is not None:
                raise RuntimeError(f"stack {name!r} did not start") from h.error
            assert h.stack is not None
            up[name] = h.stack
        yield up
    finally:
        for h in held.values():
            h.stop.set()
        for h in held.values():
            h.join(timeout=60)


@dataclass
class Ledger:
    """Everything sent to one stack, so its cache content and counters can be predicted.

    A request that finished by length leaves ``prompt + output[:-1]`` in the cache (the last
    sampled token never had its KV computed); one with ``max_new_tokens=0`` leaves its prompt.
    """

    seqs: list[list[int]] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def expected_cached(self, ids: list[int]) -> int:
        best = max((lcp(ids, s) for s in self.seqs), default=0)
        return min(best, len(ids) - 1)

    def gen(self, c: Client, ids: list[int], n: int) -> GenerateResult:
        r = greedy(c, ids, n)
        with self.lock:
            self.seqs.append(ids + r.output_ids[:-1])
            self.prompt_tokens += len(ids)
            self.cached_tokens += r.cached_tokens
        return r


@pytest.fixture(scope="module")
def ledger() -> Ledger:
    """The ``tree`` stack's ledger: every request sent to it goes through ``ledger.gen``."""
    return Ledger()


def greedy(c: Client, ids: list[int], n: int) -> GenerateResult:
    r = c.generate(
        input_ids=ids, max_new_tokens=n, temperature=0, ignore_eos=True, return_logprob=True
    )
    assert r.completion_tokens == n and r.finish_reason == "length"
    return r


def agree(a: GenerateResult, b: GenerateResult, what: str = "") -> None:
    """Identical up to a first difference, accepted only after earlier chosen-token logprobs
    already differ by > 1e-4 (then the rest may legitimately differ)."""
    assert len(a.output_ids) == len(b.output_ids), what
    for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids, strict=True)):
        if x != y:
            worst = max(
                (
                    abs(p.logprob - q.logprob)
                    for p, q in zip(a.output_logprobs[:i], b.output_logprobs[:i], strict=True)
                ),
                default=0.0,
            )
            assert worst > 1e-4, (
                f"{what}: tokens differ at {i} ({x} vs {y}) although earlier "
                f"logprobs agree within {worst:.1e}"
            )
            return


def tokenize(c: Client, text: str) -> list[int]:
    return c.tokenize(text)


# -- 1. caching does not change outputs ---------------------------------------------------------
def test_cache_hits_give_the_same_tokens_as_no_cache(
    stacks: dict[str, Stack], ledger: Ledger
) -> None:
    n = 10
    with (
        Client(stacks["tree"].endpoint, timeout=TIMEOUT) as c,
        Client(stacks["off"].endpoint, timeout=TIMEOUT) as off,
    ):
        prefix = tokenize(c, few_shot_prefix("world geography", GEOGRAPHY_SHOTS))
        qs = [tokenize(c, f"Question: {q}\nAnswer:") for q in GEOGRAPHY_QUESTIONS[:6]]
        prompts = [prefix + q for q in qs]

        # Sequential: the first is cold, the next ones hit the shared few-shot prefix.
        seq = []
        for p in prompts[:3]:
            want = ledger.expected_cached(p)
            r = ledger.gen(c, p, n)
            assert r.cached_tokens == want
            seq.append(r)
        assert all(r.cached_tokens >= len(prefix) for r in seq[1:])
        # The same prompt again: everything but the last token comes from the cache.
        again = ledger.gen(c, prompts[0], n)
        assert again.cached_tokens == len(prompts[0]) - 1
        # A follow-up extending the first answer: the generated tokens' KV is reused too.
        follow = prompts[0] + seq[0].output_ids + tokenize(c, "\nQuestion: Why?\nAnswer:")
        f = ledger.gen(c, follow, n)
        assert f.cached_tokens == len(prompts[0]) + n - 1
        # Concurrent requests sharing the cached prefix (they are admitted together).
        with ThreadPoolExecutor(3) as pool:
            conc = list(pool.map(lambda p: ledger.gen(c, p, n), prompts[3:]))
        assert all(r.cached_tokens >= len(prefix) for r in conc)

        refs = [greedy(off, p, n) for p in [*prompts, follow]]
    assert all(r.cached_tokens == 0 for r in refs)
    for i, (got, ref) in enumerate(zip([*seq, *conc], refs[:-1], strict=True)):
        agree(got, ref, f"prompt {i} (cached {got.cached_tokens}) vs --radix off")
    agree(again, seq[0], "fully cached repeat vs cold")
    agree(again, refs[0], "fully cached repeat vs --radix off")
    agree(f, refs[-1], "follow-up over cached output vs --radix off")


# -- 2. the hit rate, counted independently -----------------------------------------------------
def test_few_shot_hit_rate_matches_an_independent_count(
    stacks: dict[str, Stack], ledger: Ledger
) -> None:
    with Client(stacks["tree"].endpoint, timeout=TIMEOUT) as c:
        prefix = tokenize(c, few_shot_prefix("basic chemistry", CHEMISTRY_SHOTS))
        prompts = [prefix + tokenize(c, f"Question: {q}\nAnswer:") for q in CHEMISTRY_QUESTIONS[:6]]
        prompts.append(prompts[2])  # a repeat: capped at len - 1
        prompts.append(prefix[:40])  # a strict prefix of cached text: capped at len - 1
        before = c.stats()
        got, want, sizes = [], [], []
        for p in prompts:  # sequential: the expectation is exact
            want.append(ledger.expected_cached(p))
            got.append(ledger.gen(c, p, 2).cached_tokens)
            sizes.append(len(p))
        after = c.stats()
    assert got == want
    # Independently of the ledger: the few-shot structure alone predicts the same numbers.
    assert want[0] < len(prefix) // 4  # this few-shot prefix was new (a shared header at most)
    assert all(w >= len(prefix) for w in want[1:6])
    assert want[6] == sizes[6] - 1 and want[7] == sizes[7] - 1
    assert after.evicted_tokens == 0  # nothing was evicted, so the expectation is exact
    assert after.cached_prompt_tokens - before.cached_prompt_tokens == sum(got)
    assert after.prompt_tokens - before.prompt_tokens == sum(sizes)
    # Since start: every request this stack ever served went through the ledger.
    assert after.prompt_tokens == ledger.prompt_tokens
    assert after.cached_prompt_tokens == ledger.cached_tokens
    assert after.cache_hit_rate == pytest.approx(
        ledger.cached_tokens / ledger.prompt_tokens, rel=1e-12
    )


# -- 3. admission errors -------------------------------------------------------------------------
def _text_ids(c: Client, n: int, start: int = 0) -> list[int]:
    """``n`` token ids of real text, different for different ``start``."""
    k = len(NO_REUSE_SENTENCES)
    text = " ".join(NO_REUSE_SENTENCES[(start + i) % k] for i in range(k))
    ids = tokenize(c, text)
    while len(ids) < n:
        ids += ids
    return ids[:n]


def test_request_that_can_never_fit_is_refused_at_once(stacks: dict[str, Stack]) -> None:
    with Client(stacks["tight"].endpoint, timeout=TIMEOUT) as c:
        ids = _text_ids(c, TIGHT_KV - 1)
        t0 = time.monotonic()
        with pytest.raises(RadixMeshError) as err:  # prompt + max_new_tokens = capacity + 1
            c.generate(input_ids=ids, max_new_tokens=2, temperature=0, ignore_eos=True)
        print(f"refused in {time.monotonic() - t0:.2f} s")  # a figure; never admitted (below)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "KV capacity" in err.value.message and str(TIGHT_KV) in err.value.message
        # Exactly the capacity is fine.
        ok = c.generate(input_ids=ids, max_new_tokens=1, temperature=0, ignore_eos=True)
        assert ok.completion_tokens == 1


def test_full_queue_answers_resource_exhausted(stacks: dict[str, Stack]) -> None:
    """``--max-queue 2 --max-running 1``: of a flood of 12 long requests one runs, two wait and
    the rest are refused at once with RESOURCE_EXHAUSTED."""
    with Client(stacks["off"].endpoint, timeout=TIMEOUT) as c:
        prompts = [_text_ids(c, 200, start=i) for i in range(12)]

        def one(ids: list[int]) -> GenerateResult | RadixMeshError:
            try:
                return c.generate(input_ids=ids, max_new_tokens=8, temperature=0, ignore_eos=True)
            except RadixMeshError as exc:
                return exc

        with ThreadPoolExecutor(len(prompts)) as pool:
            outcomes = list(pool.map(one, prompts))
        refused = [o for o in outcomes if isinstance(o, RadixMeshError)]
        served = [o for o in outcomes if isinstance(o, GenerateResult)]
        assert refused, "a flood of 12 long requests never filled a queue of 2"
        assert all(e.code == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refused), refused
        assert all("queue is full" in e.message for e in refused)
        assert len(served) >= 3 and all(r.completion_tokens == 8 for r in served)
        # The server is fine afterwards.
        assert c.generate(input_ids=prompts[0][:50], max_new_tokens=1).completion_tokens == 1
        assert c.stats().queue_length == 0


# -- 4. eviction and retraction under pressure --------------------------------------------------
def _pressure_workload(c: Client) -> list[tuple[list[int], int]]:
    """24 requests, prompts of 40-150 tokens: 3 roots -> 6 shared middles -> short unique tails,
    8-16 output tokens. Shared heads keep each request's own KV small, so admission packs many
    requests into the pool, and their decodes then outgrow it."""
    roots = [tokenize(c, f"Problem: {p}\n") for p in TOT_PROBLEMS]
    mids = [tokenize(c, f"{a}\n") for a in TOT_APPROACHES] + [
        tokenize(c, "Let us think about the units first, and write each one down.\n"),
        tokenize(c, "Draw a small table of the numbers before computing anything.\n"),
    ]
    out = []
    for i in range(24):
        head = roots[i % 3] + mids[(i // 3) % 6] + roots[(i + 1) % 3]
        tail = tokenize(c, NO_REUSE_SENTENCES[i % len(NO_REUSE_SENTENCES)])
        t = min(5 + (i * 13) % 36, len(tail))  # 5 .. 40 unique tokens
        length = 40 + (i * 47) % 111  # 40 .. 150
        ids = head[: max(length - t, 30)] + tail[:t]
        out.append((ids, 16 if i < 16 else 8 + (i * 5) % 9))
    return out


def test_eviction_and_retraction_under_pressure(stacks: dict[str, Stack]) -> None:
    tight = stacks["tight"]
    with (
        Client(tight.endpoint, timeout=TIMEOUT) as c,
        Client(stacks["off"].endpoint, timeout=TIMEOUT) as off,
    ):
        work = _pressure_workload(c)
        assert min(len(p) for p, _ in work) >= 40 and max(len(p) for p, _ in work) <= 150
        before = c.stats()
        rounds: list[list[GenerateResult]] = []
        with ThreadPoolExecutor(1) as ref:  # roomy, no cache, one at a time (other stack)
            solo_f = ref.submit(lambda: [greedy(off, p, n) for p, n in work])
            # Whether a retraction is needed depends on how arrivals and finishes interleave:
            # a round may get by without one, so the workload runs again (at most 3 rounds).
            while len(rounds) < 3:
                with ThreadPoolExecutor(16) as pool:  # many concurrent decodes
                    rounds.append(list(pool.map(lambda w: greedy(c, *w), work)))
                s = c.stats()
                if s.retractions > before.retractions:
                    break
            solo = solo_f.result()
    hit = (s.cached_prompt_tokens - before.cached_prompt_tokens) / (
        s.prompt_tokens - before.prompt_tokens
    )
    print(
        f"\npressure: evicted {s.evicted_tokens - before.evicted_tokens} tokens, "
        f"{s.retractions - before.retractions} retractions, hit rate {hit:.3f}, "
        f"{s.steps - before.steps} steps, {len(rounds)} round(s)"
    )
    for n, got in enumerate(rounds):
        for i, (a, b) in enumerate(zip(got, solo, strict=True)):
            agree(a, b, f"round {n}: request {i} under pressure vs solo on a roomy stack")
    assert s.evicted_tokens - before.evicted_tokens > 0
    assert s.retractions - before.retractions > 0, "no retraction was provoked"
    assert s.cached_prompt_tokens > before.cached_prompt_tokens
    # Idle again: nothing running, nothing locked, every slot free or evictable.
    assert s.running_requests == 0 and s.queue_length == 0
    assert s.kv_request_owned == 0 and s.kv_locked == 0
    assert s.kv_free + s.kv_evictable == s.kv_capacity == TIGHT_KV
    # --debug-invariants crashes the scheduler on an accounting error; it never restarted.
    assert tight.launcher.restarts["scheduler"] == 0
    assert tight.launcher.procs["scheduler"].poll() is None
