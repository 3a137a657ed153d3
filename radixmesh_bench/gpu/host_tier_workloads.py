"""The host_tier part's workloads and their drivers (radixmesh_bench/gpu/host_tier_part.py):
random ids, every request greedy with EOS ignored through `AsyncClient` streams, a wave of
requests submitted at once; figures per run (output tok/s, TTFT p50/p99)."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

from radixmesh_bench.gpu.common import percentile

VOCAB = 128000  # random ids below Llama-3.1's specials


@dataclass(frozen=True)
class Spec:
    conversations: int = 48
    doc_len: int = 2048
    turns: int = 4
    question_len: int = 64
    output_len: int = 64
    pool_divisor: float = 3.5  # the multi-turn workload's unique KV over the GPU pool
    host_factor: float = 1.2  # host pool over the larger workload's unique KV
    gsp_groups: int = 16
    gsp_system_len: int = 4096
    gsp_waves: int = 4
    gsp_question_len: int = 128
    gsp_output_len: int = 64
    prefill_probe_len: int = 4096
    max_running: int = 64
    tiers: tuple[str, ...] = ("off", "write_back", "write_through")


QUICK = Spec(
    conversations=4,
    doc_len=40,
    turns=3,
    question_len=6,
    output_len=3,
    gsp_groups=3,
    gsp_system_len=48,
    gsp_waves=2,
    gsp_question_len=6,
    gsp_output_len=3,
    prefill_probe_len=64,
    max_running=8,
)


# -- workloads ---------------------------------------------------------------------------------
def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def multi_turn(spec: Spec) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Per conversation its document and its later questions."""
    rng = random.Random(31)
    docs = [_ids(rng, spec.doc_len) for _ in range(spec.conversations)]
    qs = [
        [_ids(rng, spec.question_len) for _ in range(spec.turns - 1)]
        for _ in range(spec.conversations)
    ]
    return docs, qs


def multi_turn_unique(spec: Spec) -> int:
    per = spec.doc_len + spec.turns * spec.output_len + (spec.turns - 1) * spec.question_len
    return spec.conversations * per


def gsp_waves(spec: Spec) -> list[list[list[int]]]:
    """Wave k: question k of every group (its system prompt + fresh ids)."""
    rng = random.Random(32)
    systems = [_ids(rng, spec.gsp_system_len) for _ in range(spec.gsp_groups)]
    return [[s + _ids(rng, spec.gsp_question_len) for s in systems] for _ in range(spec.gsp_waves)]


def gsp_unique(spec: Spec) -> int:
    per_q = spec.gsp_question_len + spec.gsp_output_len
    return spec.gsp_groups * (spec.gsp_system_len + spec.gsp_waves * per_q)


# -- driving ---------------------------------------------------------------------------------------
async def _wave(c: Any, prompts: list[list[int]], max_new: int) -> list[dict[str, Any]]:
    from radixmesh_bench.gpu.serving_client import timed_stream

    return list(await asyncio.gather(*(timed_stream(c, p, max_new) for p in prompts)))


async def drive_multi_turn(endpoint: str, spec: Spec) -> dict[str, Any]:
    from radixmesh.api import AsyncClient

    docs, qs = multi_turn(spec)
    prompts = [list(d) for d in docs]
    outs: list[dict[str, Any]] = []
    async with AsyncClient(endpoint) as c:
        t0 = time.perf_counter()
        for k in range(spec.turns):
            done = await _wave(c, prompts, spec.output_len)
            outs += done
            if k + 1 < spec.turns:
                prompts = [
                    p + o["tokens"] + q[k] for p, o, q in zip(prompts, done, qs, strict=True)
                ]
        wall = time.perf_counter() - t0
    return _figures(outs, wall)


async def drive_gsp(endpoint: str, spec: Spec) -> dict[str, Any]:
    from radixmesh.api import AsyncClient

    outs: list[dict[str, Any]] = []
    async with AsyncClient(endpoint) as c:
        t0 = time.perf_counter()
        for wave in gsp_waves(spec):
            outs += await _wave(c, wave, spec.gsp_output_len)
        wall = time.perf_counter() - t0
    return _figures(outs, wall)


def _figures(outs: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    ttft = [1e3 * o["ttft"] for o in outs]
    tokens = sum(o["completion_tokens"] for o in outs)
    return {
        "requests": len(outs),
        "wall_s": round(wall, 3),
        "output_tokens": tokens,
        "output_tok_s": round(tokens / wall, 2),
        "ttft_p50_ms": round(percentile(ttft, 0.5), 1),
        "ttft_p99_ms": round(percentile(ttft, 0.99), 1),
        "ttft_mean_ms": round(statistics.fmean(ttft), 1),
        "all_complete": all(o["finish"] == "length" for o in outs),
    }


async def prefill_cost(endpoint: str, spec: Spec) -> dict[str, float]:
    """Seconds of prefill per token: cold `prefill_probe_len`-id prompts against cold 16-id
    ones, one at a time, three each (fresh random ids: never a cache hit)."""
    from radixmesh.api import AsyncClient

    rng = random.Random(33)
    long_t: list[float] = []
    short_t: list[float] = []
    async with AsyncClient(endpoint) as c:
        for _ in range(3):
            for n, acc in ((spec.prefill_probe_len, long_t), (16, short_t)):
                (o,) = await _wave(c, [_ids(rng, n)], 1)
                acc.append(o["ttft"])
    per_token = (statistics.median(long_t) - statistics.median(short_t)) / (
        spec.prefill_probe_len - 16
    )
    return {"prefill_s_per_token": max(per_token, 1e-12), "probe_len": spec.prefill_probe_len}
