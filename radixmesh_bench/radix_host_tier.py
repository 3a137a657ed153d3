"""`radixmesh bench radix`, workloads ``multi_turn_long`` and ``host_burst``: the host KV tier
(issue 31) off, write-back and write-through.

- ``multi_turn_long``: many conversations with long histories whose total KV is several times
  the GPU pool, turns interleaved (every conversation's turn k, then every turn k + 1,
  ``--host-tier-concurrency`` requests in flight), so each returning turn finds its history
  evicted by the others. GPU pool ``unique / GPU_DIVISOR`` tokens.
- ``host_burst``: conversations whose histories fit the GPU pool together, then a burst of long
  unrelated prompts (about the whole pool, submitted at once) that evicts every history in the
  steps admitting it, then every conversation returns; ``BURST_ROUNDS`` rounds. Write-back
  copies the histories to the host in the burst's own steps; write-through copied them when
  their turns finished, so the burst's steps copy nothing. Reported apart: the burst's TTFT and
  the returning turns' TTFT.

Three runs per workload on one model process (host pool ``HOST_FACTOR x unique`` tokens on the
model service), a fresh scheduler each: ``--host-kv-tokens 0`` (off: evicted history is
recomputed), ``--host-kv-tokens H --host-tier-write write_back`` and ``write_through``.
Reported per run: hit rate (host hits included), host hit tokens, prefill tokens computed,
TTFT p50/p90/p99 (streamed, client side), output tok/s, tokens copied each way, and from the
scheduler's /metrics the write-through share, steps with copies, copy ops and the most tokens
one step copied; from the model service's /metrics the copies' time and rate per direction
(``copy_s_load``, ``copied_GBps_load``, ``copy_s_save``, ``copied_GBps_save``).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from radixmesh.api import Chunk, Client, GenerateResult

from radixmesh_bench.radix_texts import CHAT_FOLLOWUPS, NO_REUSE_SENTENCES
from radixmesh_bench.radix_workloads import Encode, Workload, unique_tokens
from radixmesh_bench.stack import progress

GPU_DIVISOR = 4  # multi_turn_long: the GPU pool holds a quarter of the workload's KV
HOST_FACTOR = 2  # the host pool holds twice the workload's KV (nothing is lost there)
NAME = "multi_turn_long"
BURST = "host_burst"
BURST_ROUNDS = 2
TIERS = ("off", "write_back", "write_through")
# The scheduler's host-tier counters that GetStats does not carry (/metrics, issue 31).
COPY_METRICS = (
    "host_written_through_tokens",
    "host_copy_steps",
    "host_copy_ops",
    "host_max_step_copy_tokens",
)


def _doc(rng: random.Random, k: int) -> str:
    return " ".join(rng.sample(NO_REUSE_SENTENCES, k))


def build_long_chat(encode: Encode, quick: bool = False, max_new: int = 8) -> Workload:
    """Conversations opening with a distinct ~250-token document (sentences in a shuffled
    order of their own), then follow-up questions."""
    n_conv = 8 if quick else 12
    sessions = []
    for i in range(n_conv):
        doc = _doc(random.Random(100 + i), 14)
        first = encode(f"Conversation {i}. Notes: {doc}\nUser: Summarize.\nBot:")
        follow = [encode(f"\nUser: {f}\nBot:") for f in CHAT_FOLLOWUPS[: 2 if quick else 3]]
        sessions.append((first, follow))
    return Workload(NAME, max_new, sessions=sessions)


def build_burst_prompts(encode: Encode, n: int, length: int, round_: int) -> list[list[int]]:
    """``n`` distinct prompts of exactly ``length`` ids (documents of shuffled sentences)."""
    out = []
    for j in range(n):
        rng = random.Random(1000 * (round_ + 1) + j)
        ids = encode(f"Report {round_}.{j}. ")
        while len(ids) < length:
            ids += encode(_doc(rng, 8) + " ")
        out.append(ids[:length])
    return out


def _turn(c: Client, ids: list[int], max_new: int) -> tuple[GenerateResult, float]:
    """One streamed greedy request: its result and its time to first token (seconds)."""
    t0 = time.perf_counter()
    ttft = 0.0
    for item in c.stream(input_ids=ids, max_new_tokens=max_new, temperature=0, ignore_eos=True):
        if isinstance(item, Chunk) and item.token_ids and not ttft:
            ttft = time.perf_counter() - t0
        if isinstance(item, GenerateResult):
            return item, ttft or time.perf_counter() - t0
    raise RuntimeError("stream ended without a result")


def _ttft(ttfts: list[float], prefix: str = "ttft") -> dict[str, float]:
    q = statistics.quantiles(ttfts, n=100, method="inclusive") if len(ttfts) > 1 else ttfts * 99
    return {
        f"{prefix}_p50_ms": round(1e3 * statistics.median(ttfts), 1),
        f"{prefix}_p90_ms": round(1e3 * q[89], 1),
        f"{prefix}_p99_ms": round(1e3 * q[98], 1),
        f"{prefix}_mean_ms": round(1e3 * statistics.fmean(ttfts), 1),
    }


class _Turns:
    """Runs rounds of requests on one client and keeps every TTFT and output token count."""

    def __init__(self, c: Client, pool: ThreadPoolExecutor, max_new: int) -> None:
        self.c, self.pool, self.max_new = c, pool, max_new
        self.ttfts: dict[str, list[float]] = {}
        self.out_tokens = 0

    def run(self, prompts: list[list[int]], tag: str) -> list[GenerateResult]:
        done = list(self.pool.map(lambda p: _turn(self.c, p, self.max_new), prompts))
        self.ttfts.setdefault(tag, []).extend(t for _, t in done)
        self.out_tokens += sum(r.completion_tokens for r, _ in done)
        return [r for r, _ in done]


def run_interleaved(endpoint: str, w: Workload, concurrency: int) -> dict[str, Any]:
    """Every conversation's turn k (``concurrency`` at a time), then every turn k + 1."""
    prompts = [list(first) for first, _ in w.sessions]
    turns = len(w.sessions[0][1]) + 1
    with Client(endpoint) as c, ThreadPoolExecutor(concurrency) as pool:
        t = _Turns(c, pool, w.max_new)
        t0 = time.perf_counter()
        for k in range(turns):
            done = t.run(prompts, "all")
            if k + 1 < turns:
                for i, r in enumerate(done):
                    prompts[i] = prompts[i] + r.output_ids + w.sessions[i][1][k]
        wall = time.perf_counter() - t0
    return _summary(t, wall)


def _summary(t: _Turns, wall: float) -> dict[str, Any]:
    every = [x for v in t.ttfts.values() for x in v]
    out: dict[str, Any] = {
        "requests": len(every),
        "wall_s": round(wall, 2),
        "output_tok_s": round(t.out_tokens / wall, 2),
        **_ttft(every),
    }
    for tag, v in t.ttfts.items():
        if tag != "all":
            out.update(_ttft(v, f"{tag}_ttft"))
    return out


def run_burst(
    endpoint: str, w: Workload, bursts: list[list[list[int]]], concurrency: int
) -> dict[str, Any]:
    """First turns of every conversation; then per round a burst (all at once) and every
    conversation's next turn (``concurrency`` at a time)."""
    prompts = [list(first) for first, _ in w.sessions]
    with Client(endpoint) as c, ThreadPoolExecutor(max(concurrency, len(bursts[0]))) as pool:
        t = _Turns(c, pool, w.max_new)
        t0 = time.perf_counter()
        done = t.run(prompts, "first")
        for k, burst in enumerate(bursts):
            for i, r in enumerate(done):
                prompts[i] = prompts[i] + r.output_ids + w.sessions[i][1][k]
            t.run(burst, "burst")
            done = t.run(prompts, "return")
        wall = time.perf_counter() - t0
    return _summary(t, wall)


def scheduler_metrics(port: int) -> dict[str, float]:
    """The host-tier counters of the scheduler's /metrics that GetStats lacks."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        name = name.removeprefix("radixmesh_").removesuffix("_total")
        if name in COPY_METRICS:
            out[name] = float(value)
    return out


def model_copy_metrics(port: int | None) -> dict[str, float]:
    """The model service's host-tier copy counters (``kv_copy_bytes_load``, ...; issue 31),
    {} without a port or when /metrics cannot be read."""
    if port is None:
        return {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if not name.startswith("radixmesh_kv_cop"):
            continue
        base, _, labels = name.partition("{")
        base = base.removeprefix("radixmesh_").removesuffix("_total")
        direction = labels.removeprefix('direction="').removesuffix('"}')
        out[f"{base}_{direction}"] = float(value)
    return out


def copy_figures(c0: dict[str, float], c1: dict[str, float]) -> dict[str, Any]:
    """Per direction, the model service's copy time over a run and the rate it achieved
    (bytes over the copy stream's time on CUDA; {} without its metrics)."""
    if not c1:
        return {}
    out: dict[str, Any] = {}
    for d in ("load", "save"):
        s = c1.get(f"kv_copy_seconds_{d}", 0.0) - c0.get(f"kv_copy_seconds_{d}", 0.0)
        b = c1.get(f"kv_copy_bytes_{d}", 0.0) - c0.get(f"kv_copy_bytes_{d}", 0.0)
        out[f"copy_s_{d}"] = round(s, 4)
        out[f"copied_GBps_{d}"] = round(b / s / 1e9, 2) if s > 0 else 0.0
    return out


def tier_args(tier: str, host: int) -> list[str]:
    if tier == "off":
        return ["--radix", "tree", "--host-kv-tokens", "0"]
    return ["--radix", "tree", "--host-kv-tokens", str(host), "--host-tier-write", tier]


def measure_tiers(
    name: str, gpu: int, host: int, model: str, drive: Callable[[str], dict[str, Any]]
) -> list[dict[str, Any]]:
    """``drive(endpoint)`` once per tier setting on one model process, GetStats and /metrics
    deltas around each run."""
    from radixmesh_bench.radix_bench import BenchStack, _gen

    log_dir = Path(tempfile.mkdtemp(prefix=f"radix-bench-{name}-"))
    stack = BenchStack(gpu, log_dir, model, host_kv_tokens=host, metrics=True)
    runs = []
    try:
        for tier in TIERS:
            progress(f"  {name}: host tier {tier}")
            stack.use_scheduler(tier_args(tier, host))
            port, mport = stack.metrics_port("scheduler"), stack.metrics_port("model")
            with Client(stack.endpoint) as c:
                _gen(c, [1, 2, 3, 4], 1)  # warm-up (excluded by the deltas)
                s0, m0, c0 = c.stats(), scheduler_metrics(port), model_copy_metrics(mport)
                r = drive(stack.endpoint)
                s1, m1, c1 = c.stats(), scheduler_metrics(port), model_copy_metrics(mport)
            runs.append(tier_row(tier, host, r, s0, s1, m0, m1))
            r.update(copy_figures(c0, c1))
            progress(
                f"    hit {r['hit_rate']:.3f} (host {r['host_hit_tokens']} tokens), prefill "
                f"{r['prefill_tokens_computed']} tokens, TTFT p50 {r['ttft_p50_ms']} ms, "
                f"saved {r['saved_tokens']} (through {r['written_through_tokens']}), most "
                f"per step {r['max_step_copy_tokens']}"
            )
    finally:
        stack.stop()
    return runs


def tier_row(
    tier: str, host: int, r: dict[str, Any], s0: Any, s1: Any, m0: dict, m1: dict
) -> dict[str, Any]:
    """One run's figures; ``r`` gains them (the caller logs it)."""
    dp = s1.prompt_tokens - s0.prompt_tokens
    dc = s1.cached_prompt_tokens - s0.cached_prompt_tokens
    dh = s1.host_hit_tokens - s0.host_hit_tokens
    steps = s1.steps - s0.steps
    saved = s1.host_saved_tokens - s0.host_saved_tokens
    loaded = s1.host_loaded_tokens - s0.host_loaded_tokens
    copy_steps = m1.get("host_copy_steps", 0) - m0.get("host_copy_steps", 0)
    r.update(
        tier=tier,
        host_kv_tokens=0 if tier == "off" else host,
        prompt_tokens=dp,
        hit_rate=round(dc / dp, 4) if dp else 0.0,
        gpu_hit_rate=round((dc - dh) / dp, 4) if dp else 0.0,
        host_hit_rate=round(dh / dp, 4) if dp else 0.0,
        host_hit_tokens=dh,
        prefill_tokens_computed=dp - dc,
        saved_tokens=saved,
        written_through_tokens=int(
            m1.get("host_written_through_tokens", 0) - m0.get("host_written_through_tokens", 0)
        ),
        loaded_tokens=loaded,
        evicted_tokens=s1.evicted_tokens - s0.evicted_tokens,
        steps=steps,
        copy_steps=int(copy_steps),
        copy_ops=int(m1.get("host_copy_ops", 0) - m0.get("host_copy_ops", 0)),
        copied_tokens_per_step=round((saved + loaded) / steps, 2) if steps else 0.0,
        copied_tokens_per_copy_step=round((saved + loaded) / copy_steps, 1) if copy_steps else 0,
        # A high-water mark of the scheduler's life: a fresh scheduler per run makes it this
        # run's (the warm-up copies nothing).
        max_step_copy_tokens=int(m1.get("host_max_step_copy_tokens", 0)),
    )
    return r


def run_host_tier(
    encode: Encode, *, quick: bool, max_new: int, concurrency: int, model: str
) -> dict[str, Any]:
    """``multi_turn_long`` with the tier off, write-back and write-through."""
    w = build_long_chat(encode, quick, max_new)
    prompts, full = w.planned()
    unique = unique_tokens(full)
    longest = max(len(f) for f in full)
    gpu = max(unique // GPU_DIVISOR, longest + max_new + 16)
    host = HOST_FACTOR * unique
    entry = _entry(prompts, unique, gpu, host)
    progress(f"{NAME}: {len(prompts)} requests, {unique} unique tokens, GPU {gpu}, host {host}")
    conc = min(concurrency, len(w.sessions))
    entry["runs"] = measure_tiers(NAME, gpu, host, model, lambda ep: run_interleaved(ep, w, conc))
    return entry


def run_host_burst(
    encode: Encode, *, quick: bool, max_new: int, concurrency: int, model: str
) -> dict[str, Any]:
    """``host_burst`` with the tier off, write-back and write-through."""
    w = build_long_chat(encode, quick, max_new)
    w.sessions = w.sessions[: 6 if quick else 8]
    w.name = BURST
    first_full = [len(f) + max_new for f, _ in w.sessions]
    gpu = sum(first_full) + 64  # every history fits at once
    n_burst = 3 if quick else 4
    length = gpu // n_burst - max_new - 8  # together the burst fills the pool
    bursts = [build_burst_prompts(encode, n_burst, length, k) for k in range(BURST_ROUNDS)]
    prompts, full = w.planned()
    flat = [p for b in bursts for p in b]
    unique = unique_tokens(full + flat)  # counts a last turn it does not run: a bound
    host = HOST_FACTOR * unique
    entry = _entry(prompts + flat, unique, gpu, host)
    entry.update(burst_prompts=n_burst, burst_prompt_tokens=length, rounds=BURST_ROUNDS)
    progress(f"{BURST}: {n_burst} x {length}-token bursts, GPU {gpu}, host {host}")
    conc = min(concurrency, len(w.sessions))
    entry["runs"] = measure_tiers(
        BURST, gpu, host, model, lambda ep: run_burst(ep, w, bursts, conc)
    )
    return entry


def _entry(prompts: list[list[int]], unique: int, gpu: int, host: int) -> dict[str, Any]:
    return {
        "requests": len(prompts),
        "prompt_tokens": sum(len(p) for p in prompts),
        "unique_tokens": unique,
        "kv_tokens": gpu,
        "host_kv_tokens": host,
        "workload_over_gpu_pool": round(unique / gpu, 2),
        "runs": [],
    }
