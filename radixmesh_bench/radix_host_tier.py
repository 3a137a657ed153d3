"""`radixmesh bench radix`, workload ``multi_turn_long``: the host KV tier (issue 31).

Many conversations with long histories whose total KV is several times the GPU pool, turns
interleaved (every conversation's turn k, then every turn k + 1, ``--concurrency`` requests in
flight), so each returning turn finds its history evicted by the others. Two runs on one model
process (GPU pool ``unique / GPU_DIVISOR`` tokens, host pool ``HOST_FACTOR x unique``), a fresh
scheduler each: ``--host-kv-tokens 0`` (tier off: evicted history is recomputed) and
``--host-kv-tokens H`` (tier on: it is loaded back). Reported per run: hit rate (host hits
included), host hit tokens, prefill tokens computed, TTFT p50/p90 (streamed, client side),
output tok/s, tokens saved/loaded.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from radixmesh.api import Chunk, Client, GenerateResult

from radixmesh_bench.radix_texts import CHAT_FOLLOWUPS, NO_REUSE_SENTENCES
from radixmesh_bench.radix_workloads import Encode, Workload, unique_tokens
from radixmesh_bench.stack import progress

GPU_DIVISOR = 4  # the GPU pool holds a quarter of the workload's KV
HOST_FACTOR = 2  # the host pool holds twice the workload's KV (nothing is lost there)
NAME = "multi_turn_long"


def build_long_chat(encode: Encode, quick: bool = False, max_new: int = 8) -> Workload:
    """Conversations opening with a distinct ~250-token document (sentences in a shuffled
    order of their own), then follow-up questions."""
    n_conv = 8 if quick else 12
    sessions = []
    for i in range(n_conv):
        rng = random.Random(100 + i)
        doc = rng.sample(NO_REUSE_SENTENCES, 14)
        first = encode(f"Conversation {i}. Notes: {' '.join(doc)}\nUser: Summarize.\nBot:")
        follow = [encode(f"\nUser: {f}\nBot:") for f in CHAT_FOLLOWUPS[: 2 if quick else 3]]
        sessions.append((first, follow))
    return Workload(NAME, max_new, sessions=sessions)


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


def run_interleaved(endpoint: str, w: Workload, concurrency: int) -> dict[str, Any]:
    """Every conversation's turn k (``concurrency`` at a time), then every turn k + 1."""
    prompts = [list(first) for first, _ in w.sessions]
    turns = len(w.sessions[0][1]) + 1
    ttfts: list[float] = []
    out_tokens = 0
    with Client(endpoint) as c, ThreadPoolExecutor(concurrency) as pool:
        t0 = time.perf_counter()
        for k in range(turns):
            done = list(pool.map(lambda p: _turn(c, p, w.max_new), prompts))
            for i, (r, ttft) in enumerate(done):
                ttfts.append(ttft)
                out_tokens += r.completion_tokens
                if k + 1 < turns:
                    prompts[i] = prompts[i] + r.output_ids + w.sessions[i][1][k]
        wall = time.perf_counter() - t0
    q = statistics.quantiles(ttfts, n=10)
    return {
        "requests": len(ttfts),
        "wall_s": round(wall, 2),
        "output_tok_s": round(out_tokens / wall, 2),
        "ttft_p50_ms": round(1e3 * statistics.median(ttfts), 1),
        "ttft_p90_ms": round(1e3 * q[8], 1),
        "ttft_mean_ms": round(1e3 * statistics.fmean(ttfts), 1),
    }


def run_host_tier(
    encode: Encode, *, quick: bool, max_new: int, concurrency: int, model: str
) -> dict[str, Any]:
    """The workload with the host tier off and on (one model process, a scheduler each)."""
    from radixmesh_bench.radix_bench import BenchStack, _gen

    w = build_long_chat(encode, quick, max_new)
    prompts, full = w.planned()
    unique = unique_tokens(full)
    longest = max(len(f) for f in full)
    gpu = max(unique // GPU_DIVISOR, longest + max_new + 16)
    host = HOST_FACTOR * unique
    entry: dict[str, Any] = {
        "requests": len(prompts),
        "prompt_tokens": sum(len(p) for p in prompts),
        "unique_tokens": unique,
        "kv_tokens": gpu,
        "host_kv_tokens": host,
        "workload_over_gpu_pool": round(unique / gpu, 2),
        "runs": [],
    }
    progress(f"{NAME}: {len(prompts)} requests, {unique} unique tokens, GPU {gpu}, host {host}")
    log_dir = Path(tempfile.mkdtemp(prefix=f"radix-bench-{NAME}-"))
    stack = BenchStack(gpu, log_dir, model, host_kv_tokens=host)
    try:
        for tier in (0, host):
            progress(f"  {NAME}: --host-kv-tokens {tier}")
            stack.use_scheduler(["--radix", "tree", "--host-kv-tokens", str(tier)])
            with Client(stack.endpoint) as c:
                _gen(c, [1, 2, 3, 4], 1)  # warm-up (excluded by the deltas)
                s0 = c.stats()
                r = run_interleaved(stack.endpoint, w, min(concurrency, len(w.sessions)))
                s1 = c.stats()
            dp = s1.prompt_tokens - s0.prompt_tokens
            dc = s1.cached_prompt_tokens - s0.cached_prompt_tokens
            r = {
                "host_kv_tokens": tier,
                **r,
                "prompt_tokens": dp,
                "hit_rate": round(dc / dp, 4) if dp else 0.0,
                "host_hit_tokens": s1.host_hit_tokens - s0.host_hit_tokens,
                "prefill_tokens_computed": dp - dc,
                "saved_tokens": s1.host_saved_tokens - s0.host_saved_tokens,
                "loaded_tokens": s1.host_loaded_tokens - s0.host_loaded_tokens,
                "evicted_tokens": s1.evicted_tokens - s0.evicted_tokens,
            }
            progress(
                f"    hit {r['hit_rate']:.3f} (host {r['host_hit_tokens']} tokens), prefill "
                f"{r['prefill_tokens_computed']} tokens, TTFT p50 {r['ttft_p50_ms']} ms"
            )
            entry["runs"].append(r)
    finally:
        stack.stop()
    return entry
