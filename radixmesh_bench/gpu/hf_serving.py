"""The HF transformers peer for the serving parts: static batches through `generate`.

Runs in its own process (`python radixmesh_bench/gpu/serving.py --hf-worker ...`). HF has no
continuous batching, so requests go in order in static batches of `batch`: prompts left-padded (pad
id 0, attention mask), greedy, EOS ignored, every row generating the batch's longest output length.
Only each request's own output length counts as output tokens (the rest is padding work HF
cannot skip). Timing per batch: one `generate` of the full length (counted in the wall time)
and, before it, one of a single token (not counted) whose time stands for the batch's prefill:
a request's TTFT is the full runs of the batches before its own plus its batch's prefill, and
its ITL is (full - prefill) / (longest output - 1), the same for every row of the batch.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from radixmesh_bench.gpu.common import copy_bandwidth_gbps, hf_generate_timed, log, percentile


def worker_hf_static(
    model_name: str, device: str, reqs: list[tuple[list[int], int]], batch: int
) -> dict[str, Any]:
    from model_service.random_configs import random_config
    from radixmesh_bench.gpu.common import hf_model

    res: dict[str, Any] = {}
    if device.startswith("cuda"):
        res["copy_bandwidth_GBps"] = copy_bandwidth_gbps()
    hf_cfg, _ = random_config(model_name)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    t = time.perf_counter()
    model = hf_model(hf_cfg, dtype, device=device, attn="sdpa")
    res["build_s"] = time.perf_counter() - t
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0

    def gen(ids: torch.Tensor, mask: torch.Tensor, n: int) -> float:
        seconds, made = hf_generate_timed(model, ids, mask, n)
        if made != n:
            raise RuntimeError(f"HF generated {made} tokens, not {n}")
        return seconds

    def padded(chunk: list[tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p, _ in chunk)
        ids = [[0] * (width - len(p)) + p for p, _ in chunk]
        mask = [[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk]
        return (torch.tensor(ids, device=device), torch.tensor(mask, device=device))

    batches = [reqs[i : i + batch] for i in range(0, len(reqs), batch)]
    ids0, mask0 = padded(batches[0])
    gen(ids0, mask0, 4)  # warm-up
    wall = 0.0
    ttft: list[float] = []
    itl: list[float] = []
    generated = 0
    for chunk in batches:
        ids, mask = padded(chunk)
        longest = max(o for _, o in chunk)
        first = gen(ids, mask, 1)
        full = gen(ids, mask, longest)
        ttft += [(wall + first) * 1e3] * len(chunk)
        if longest > 1:
            step = (full - first) / (longest - 1) * 1e3
            itl += [step] * sum(o - 1 for _, o in chunk)
        wall += full
        generated += len(chunk) * longest
        log(f"HF batch of {len(chunk)}: {longest} tokens in {full:.1f}s (prefill {first:.2f}s)")
    out_tokens = sum(o for _, o in reqs)
    res["rows"] = [
        {
            "table": "serving",
            "system": "hf-transformers",
            "variant": f"generate, static batches of {batch}, sdpa, {str(dtype)[6:]}, greedy",
            "path": "in-process generate",
            "model": f"{model_name} random",
            "requests": len(reqs),
            "input_tokens": sum(len(p) for p, _ in reqs),
            "output_tokens": out_tokens,
            "generated_tokens_incl_padding": generated,
            "wall_s": wall,
            "req_s": len(reqs) / wall,
            "output_tok_s": out_tokens / wall,
            "input_tok_s": sum(len(p) for p, _ in reqs) / wall,
            "ttft_ms_p50": percentile(ttft, 0.5),
            "ttft_ms_p99": percentile(ttft, 0.99),
            "itl_ms_p50": percentile(itl, 0.5) if itl else None,
            "itl_ms_p99": percentile(itl, 0.99) if itl else None,
            "itl_ms_mean": statistics.mean(itl) if itl else None,
            "latency_note": "estimates from per-batch timings (see hf_serving.py)",
        }
    ]
    return res
