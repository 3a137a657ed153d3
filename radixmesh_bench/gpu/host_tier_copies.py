"""Part `host_tier`'s (a): the link's peak and the host tier's copy rates (issue 31).

Pinned host <-> device copies of one large contiguous buffer, both directions (the link's
measured peak); then `model_service.kv_pool.KVPool.copy` (the code the model service runs for
every KVCopy) on a pool of the model's KV shape, `COPY_TOKENS` tokens at scattered slots (every
host slot its own run: the worst case) and at contiguous ones (one run: the tree's usual
case), both directions, with a bit-exact round trip per pattern. `host_tier_part.py` runs it in
a worker process before its stack starts (the parent then holds no CUDA context).
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

COPY_TOKENS = 8192  # tokens per timed tier copy (1 GiB of 8B KV)
PEAK_MIB = 1024  # the link probe's buffer


def _timed(fn: Any, cuda: bool, reps: int) -> float:
    """Median seconds of `fn()` (synchronised on CUDA) after one warm-up call."""
    import torch

    fn()
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _link(n: int, device: str, reps: int) -> tuple[float, float]:
    """Seconds per `n`-byte copy host -> device and back (pinned host memory on CUDA)."""
    import torch

    cuda = device.startswith("cuda")
    host = torch.empty(n, dtype=torch.uint8, pin_memory=cuda)
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    h2d = _timed(lambda: dev.copy_(host, non_blocking=True), cuda, reps)
    d2h = _timed(lambda: host.copy_(dev, non_blocking=True), cuda, reps)
    return h2d, d2h


def measure_copies(model: str, device: str, quick: bool) -> dict[str, Any]:
    """The link's peak (pinned, contiguous, both directions) and the tier's KVPool.copy rates:
    the path the model service runs on `device` (staged on CUDA, the reference on CPU), with
    the chunk size, the host slots' runs and how they moved; on CPU also the staged path."""
    import torch

    from model_service.kv_pool import kv_bytes_per_token
    from model_service.random_configs import config_dict

    cuda = device.startswith("cuda")
    reps = 3 if quick else 10
    n = (8 if quick else PEAK_MIB) << 20
    h2d, d2h = _link(n, device, reps)
    cfg = config_dict(model)
    layers, heads = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    dtype = torch.bfloat16 if cuda else torch.float32
    shape = (layers, heads, head_dim, dtype)
    tokens = 256 if quick else COPY_TOKENS
    out: dict[str, Any] = {
        "link_h2d_GBps": n / h2d / 1e9,
        "link_d2h_GBps": n / d2h / 1e9,
        "link_buffer_MiB": n >> 20,
        "kv_bytes_per_token": kv_bytes_per_token(*shape),
        "copy_tokens": tokens,
    }
    out.update(_tier_rates(shape, tokens, device, reps, None, ""))
    if not cuda:  # the CUDA path's code on CPU: memcpy-bound, but no extra full copies
        out.update(_tier_rates(shape, tokens, device, reps, True, "cpu_staged_"))
    out["tier_load_fraction_of_peak"] = out["tier_load_scattered_GBps"] / out["link_h2d_GBps"]
    out["tier_save_fraction_of_peak"] = out["tier_save_scattered_GBps"] / out["link_d2h_GBps"]
    return out


def _tier_rates(
    shape: tuple[Any, ...], tokens: int, device: str, reps: int, staged: bool | None, pre: str
) -> dict[str, Any]:
    """KVPool.copy of `tokens` tokens at scattered slots (runs of one: the worst case) and
    contiguous ones, both directions, on a pool of 2 x `tokens`; then a round trip (save,
    clear the GPU slots, load back) checked bit for bit: the first GPU run proves the path."""
    from model_service.kv_copy import count_runs
    from model_service.kv_pool import KVPool, kv_bytes_per_token

    layers, heads, head_dim, dtype = shape
    cuda = device.startswith("cuda")
    per_token = kv_bytes_per_token(*shape)
    pool = KVPool(layers, 2 * tokens, heads, head_dim, dtype, device)
    pool.add_host_tier(2 * tokens, staged=staged)
    cp = pool.copier
    out: dict[str, Any] = {
        f"{pre}copy_path": "reference" if cp is None else "staged",
        f"{pre}copy_chunk_tokens": 0 if cp is None else cp.chunk_tokens,
        f"{pre}copy_chunk_MiB": 0 if cp is None else cp.chunk_tokens * per_token / 2**20,
        f"{pre}copy_direct_min_run": 0 if cp is None else cp.min_run,
    }
    rng = random.Random(0)
    for name in ("scattered", "contiguous"):
        if name == "scattered":  # the host side alike: scattered, or the pool's first tokens
            slots, dst = (
                rng.sample(range(2 * tokens), tokens),
                rng.sample(range(2 * tokens), tokens),
            )
        else:
            slots = dst = list(range(tokens))
        save = _timed(lambda s=slots, d=dst: pool.copy(True, s, d), cuda, reps)
        moved = cp.last if cp is not None else None
        load = _timed(lambda s=slots, d=dst: pool.copy(False, d, s), cuda, reps)
        out[f"{pre}tier_save_{name}_GBps"] = tokens * per_token / save / 1e9
        out[f"{pre}tier_load_{name}_GBps"] = tokens * per_token / load / 1e9
        out[f"{pre}tier_load_{name}_us_per_token"] = 1e6 * load / tokens
        out[f"{pre}tier_{name}_host_runs"] = count_runs(dst)
        if moved is not None and cp is not None:
            out[f"{pre}tier_{name}_chunks"] = moved.chunks
            out[f"{pre}tier_{name}_direct_runs"] = moved.direct_runs
            out[f"{pre}tier_{name}_gathered_tokens"] = moved.gathered_tokens
        out[f"{pre}tier_roundtrip_exact_{name}"] = _roundtrip(pool, slots, dst)
    return out


def _roundtrip(pool: Any, slots: list[int], dst: list[int]) -> bool:
    """Save `slots` to host `dst`, clear them, load them back: same bytes on both sides."""
    import torch

    idx = torch.tensor(slots, device=pool.k.device)
    torch.manual_seed(1)
    pool.k.index_copy_(1, idx, torch.randn_like(pool.k[:, idx]))
    pool.v.index_copy_(1, idx, torch.randn_like(pool.v[:, idx]))
    k, v = pool.k[:, idx].clone(), pool.v[:, idx].clone()
    pool.copy(True, slots, dst)
    pool.k[:, idx] = 0
    pool.v[:, idx] = 0
    pool.copy(False, dst, slots)
    pool.sync_host()
    hidx = torch.tensor(dst)
    host_ok = torch.equal(pool.host_k[:, hidx], k.cpu()) and torch.equal(
        pool.host_v[:, hidx], v.cpu()
    )
    return bool(host_ok and torch.equal(pool.k[:, idx], k) and torch.equal(pool.v[:, idx], v))


# -- the part ------------------------------------------------------------------------------------
