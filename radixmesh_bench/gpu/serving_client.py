"""Driving one serving run through the stack's front door, and its figures.

Every request is submitted at once (request rate inf) as a `radixmesh.api.AsyncClient` stream with
`input_ids`, greedy, EOS ignored. TTFT: submit to first chunk; ITL: gaps between chunks (a chunk
of k tokens counts as k gaps of 1/k); the scheduler's GetStats counters before and after give
the hit rate, radix bookkeeping time, steps, evictions and retractions of the run alone.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from radixmesh_bench.gpu import serving_workloads as wl
from radixmesh_bench.gpu.common import percentile
from radixmesh_bench.serving_clients import chunk_gaps, timed_grpc_stream


async def _one(client: Any, req: wl.Req) -> dict[str, Any]:
    return await timed_stream(client, req.ids, req.max_new)


async def timed_stream(client: Any, ids: list[int], max_new: int) -> dict[str, Any]:
    """One greedy, EOS-ignoring stream with its arrival times (the client `bench serving` uses,
    radixmesh_bench/serving_clients.py): TTFT, ITL samples, end to end, the output tokens and
    the token counts the server reported."""
    s = await timed_grpc_stream(
        client, input_ids=ids, max_new_tokens=max_new, ignore_eos=True, temperature=0.0
    )
    final = s.result
    return {
        "t0": s.t0,
        "t1": s.t1,
        "ttft": (s.arrivals[0][0] if s.arrivals else s.t1) - s.t0,
        "e2e": s.t1 - s.t0,
        "itl": chunk_gaps(s.arrivals),
        "tokens": final.output_ids if final else [],
        "completion_tokens": final.completion_tokens if final else 0,
        "prompt_tokens": final.prompt_tokens if final else 0,
        "finish": final.finish_reason if final else "none",
    }


async def drive(endpoint: str, reqs: list[wl.Req]) -> dict[str, Any]:
    """Submit every request at once; per-request results and the scheduler's counters."""
    from radixmesh.api import AsyncClient

    async with AsyncClient(endpoint) as c:
        s0 = await c.stats()
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(_one(c, r) for r in reqs))
        wall = time.perf_counter() - t0
        s1 = await c.stats()
    d = {
        f: getattr(s1, f) - getattr(s0, f)
        for f in (
            "prompt_tokens",
            "cached_prompt_tokens",
            "generated_tokens",
            "steps",
            "radix_seconds",
            "evicted_tokens",
            "retractions",
            "finished_requests",
        )
    }
    return {"outs": outs, "wall_s": wall, "stats": d}


def summarize(reqs: list[wl.Req], run: dict[str, Any]) -> dict[str, Any]:
    outs, wall, st = run["outs"], run["wall_s"], run["stats"]
    ms = 1e3
    ttft = [o["ttft"] * ms for o in outs]
    e2e = [o["e2e"] * ms for o in outs]
    itl = [x * ms for o in outs for x in o["itl"]]
    out_tok = sum(o["completion_tokens"] for o in outs)
    in_tok = sum(len(r.ids) for r in reqs)
    computed = st["prompt_tokens"] - st["cached_prompt_tokens"]
    return {
        "requests": len(reqs),
        "input_tokens": in_tok,
        "output_tokens": out_tok,
        "wall_s": wall,
        "req_s": len(reqs) / wall,
        "output_tok_s": out_tok / wall,
        "input_tok_s": in_tok / wall,
        "computed_prefill_tok_s": computed / wall,
        "ttft_ms_p50": percentile(ttft, 0.5),
        "ttft_ms_p99": percentile(ttft, 0.99),
        "ttft_ms_mean": sum(ttft) / len(ttft),
        "itl_ms_p50": percentile(itl, 0.5) if itl else None,
        "itl_ms_p99": percentile(itl, 0.99) if itl else None,
        "itl_samples": len(itl),
        "e2e_ms_p50": percentile(e2e, 0.5),
        "e2e_ms_p99": percentile(e2e, 0.99),
        "hit_rate": st["cached_prompt_tokens"] / st["prompt_tokens"]
        if st["prompt_tokens"]
        else 0.0,
        "cached_prompt_tokens": st["cached_prompt_tokens"],
        "scheduler_prompt_tokens": st["prompt_tokens"],
        "radix_seconds": st["radix_seconds"],
        "radix_share": st["radix_seconds"] / wall,
        "scheduler_steps": st["steps"],
        "evicted_tokens": st["evicted_tokens"],
        "retractions": st["retractions"],
        "all_complete": all(
            o["finish"] == "length"
            and o["completion_tokens"] == r.max_new
            and o["prompt_tokens"] == len(r.ids)
            for o, r in zip(outs, reqs, strict=True)
        ),
        "finish_reasons": sorted({o["finish"] for o in outs}),
    }
