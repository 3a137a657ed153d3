"""Throughput workers: our ModelRunner in-process, and HF transformers `generate` as the peer.

Each worker runs in its own process (so each gets the whole GPU) and writes rows for the part's
JSON. Workload: `batch` requests of `input_len` random prompt tokens, greedy, exactly
`output_len` new tokens each (EOS ignored on both sides). tok/s counts output tokens over the
wall time from the first forward pass to the last token (prefill included), as HF's generate
is timed; per-step decode times are reported separately.

Roofline at batch 1: a decode step must read every weight once, so weight bytes over the copy
bandwidth measured in the same process is the floor; `roofline_fraction` = floor / measured
decode step. `roofline_fraction_bytes` counts what a step really must read: weights without
the embedding table (one row of it is read) plus the KV read at the mean context length.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from radixmesh_bench.gpu.common import (
    copy_bandwidth_gbps,
    hf_generate_timed,
    log,
    percentile,
    replay_ms,
)

MODEL = "llama-3.1-8b"


def prompts(batch: int, input_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(vocab, 128000), (batch, input_len), generator=g).tolist()


def launch_us(n: int = 2000) -> float:
    """Host cost of one tiny CUDA kernel launch from Python (no sync in between): a decode
    step that is not captured in a graph pays this several hundred times."""
    x = torch.zeros(1, device="cuda")
    for _ in range(50):
        x.add_(1)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / n * 1e6


class _HostTimer:
    """Wraps bound methods on instances to sum their wall time (bench-only instrumentation)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self._undo: list[tuple[Any, str]] = []

    def wrap(self, obj: Any, name: str, key: str) -> None:
        fn = getattr(obj, name)

        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.sums[key] = self.sums.get(key, 0.0) + time.perf_counter() - t

        setattr(obj, name, timed)
        self._undo.append((obj, name))

    def restore(self) -> None:
        for obj, name in self._undo:
            delattr(obj, name)
        self._undo.clear()


def graph_replay_gpu_ms(graphs: Any, bs: int, reps: int = 20) -> float | None:
    """GPU time of one replay of the bucket graph serving `bs` rows, as last planned."""
    b = graphs.bucket_for(bs)
    if b is None:
        return None
    return replay_ms(graphs.graphs[b].graph, reps)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _workload(
    runner: Any, batch: int, input_len: int, output_len: int, step0: int, seed: int = 0
) -> dict[str, Any]:
    from radixmesh_wire.step_ops import AdmitOp, Sampling, StepOps

    ps = prompts(batch, input_len, 128256, seed)
    stride = input_len + output_len
    handles = list(range(1, batch + 1))
    admits = [
        AdmitOp(
            h,
            Sampling(temperature=0.0),
            0,
            [],
            ps[i],
            list(range(i * stride, i * stride + input_len)),
            True,
        )
        for i, h in enumerate(handles)
    ]
    tokens: list[list[int]] = [[] for _ in handles]
    step_s: list[float] = []
    sid = step0
    _sync()
    t0 = time.perf_counter()
    out = runner.step(StepOps(sid, admits=admits))
    step_s.append(time.perf_counter() - t0)
    for r in out.rows:
        tokens[r.handle - 1].append(r.token)
    for j in range(1, output_len):
        sid += 1
        slots = [i * stride + input_len + j - 1 for i in range(batch)]
        ts = time.perf_counter()
        out = runner.step(StepOps(sid, decode_handles=handles, decode_slots=slots))
        step_s.append(time.perf_counter() - ts)
        for r in out.rows:
            tokens[r.handle - 1].append(r.token)
    _sync()
    total = time.perf_counter() - t0
    runner.step(StepOps(sid + 1, releases=handles))
    dec = [s * 1e3 for s in step_s[1:]]
    return {
        "total_s": total,
        "prefill_ms": step_s[0] * 1e3,
        "decode_step_ms_median": statistics.median(dec) if dec else float("nan"),
        "decode_step_ms_p90": percentile(dec, 0.9),
        "decode_step_ms_p99": percentile(dec, 0.99),
        "decode_step_ms_min": min(dec or [0]),
        "tok_s": batch * output_len / total,
        "tokens": tokens,
        "steps": len(step_s),
    }


def worker_ours(batch: int, input_len: int, output_len: int, kv_tokens: int = 0) -> dict[str, Any]:
    from model_service.config import ModelServiceConfig
    from model_service.engine import build_engine

    bw = copy_bandwidth_gbps()
    lus = launch_us()
    log(f"copy bandwidth {bw:.0f} GB/s, kernel launch {lus:.1f} us; building {MODEL}")
    t = time.perf_counter()
    cfg = ModelServiceConfig(
        random_weights=MODEL,
        device="cuda",
        dtype="bfloat16",
        attention="flashinfer",
        kv_tokens=kv_tokens,
    )
    eng = build_engine(cfg)
    build_s = time.perf_counter() - t
    runner = eng.runner
    model = runner.model
    a = model.args
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    embed_bytes = model.model.embed_tokens.weight.numel() * 2
    kv_per_tok = 2 * a.num_layers * a.num_kv_heads * a.head_dim * 2
    graphs = runner.decode_graphs
    res: dict[str, Any] = {
        "copy_bandwidth_GBps": bw,
        "launch_us": lus,
        "build_s": build_s,
        "weight_bytes": weight_bytes,
        "kv_tokens": runner.pool.capacity,
        "attention": eng.attention_backend,
        "fused": model.fused,
        "kernels": model.ops.name if model.ops else "-",
        "kernels_note": model.ops_note,
        "cuda_graph_buckets": graphs.buckets if graphs else [],
        "cuda_graph_capture_s": graphs.capture_s if graphs else None,
        "rows": [],
    }
    log(
        f"built in {build_s:.1f}s, attention={eng.attention_backend}, "
        f"kv_tokens={runner.pool.capacity}, graphs={res['cuda_graph_buckets']}"
    )
    variants = [("flashinfer+cuda-graphs", graphs), ("flashinfer eager", None)]
    if graphs is None:
        variants = [(f"{eng.attention_backend} eager", None)]
    first_tokens = None
    sid = 0
    for name, g in variants:
        runner.decode_graphs = g
        _workload(runner, batch, input_len, min(8, output_len), sid)  # warm-up
        sid += 100
        timer = _HostTimer()
        timer.wrap(runner, "_collect_rows", "collect_rows")
        timer.wrap(runner, "_sample", "sample_incl_gpu_wait")
        timer.wrap(runner.attn, "plan", "attn_plan")
        if g is not None:
            timer.wrap(g, "run", "graph_plan_copy_launch")
        try:
            r = _workload(runner, batch, input_len, output_len, sid)
        finally:
            timer.restore()
        sid += output_len + 10
        r["host_ms_per_step"] = {k: v / r["steps"] * 1e3 for k, v in timer.sums.items()}
        if g is not None:
            r["graph_replay_gpu_ms"] = graph_replay_gpu_ms(g, batch)
        toks = r.pop("tokens")
        if first_tokens is None:
            first_tokens = toks
            agree = None
        else:
            agree = statistics.mean(
                float(x == y)
                for a_, b_ in zip(first_tokens, toks, strict=True)
                for x, y in zip(a_, b_, strict=True)
            )
        floor_ms = weight_bytes / (bw * 1e9) * 1e3
        ctx = input_len + output_len / 2
        need = weight_bytes - embed_bytes + batch * ctx * kv_per_tok
        floor2_ms = need / (bw * 1e9) * 1e3
        med = r["decode_step_ms_median"]
        gpu = r.get("graph_replay_gpu_ms")
        if gpu:
            r["roofline_fraction_gpu_forward"] = floor_ms / gpu
            r["host_overhead_ms_per_step"] = med - gpu
        row = {
            "system": "radixmesh",
            "variant": name,
            "path": "in-process ModelRunner",
            "model": f"{MODEL} random bf16",
            "batch": batch,
            "input_len": input_len,
            "output_len": output_len,
            **r,
            "weight_floor_ms": floor_ms,
            "roofline_fraction": floor_ms / med,
            "bytes_floor_ms": floor2_ms,
            "roofline_fraction_bytes": floor2_ms / med,
            "token_agreement_vs_first_variant": agree,
            "graph_replays": g.replays if g else 0,
        }
        log(
            f"{name}: {r['tok_s']:.1f} tok/s, decode step {med:.2f} ms, "
            f"roofline {floor_ms / med:.2f}"
        )
        res["rows"].append(row)
    runner.decode_graphs = graphs
    return res


def worker_hf(batch: int, input_len: int, output_len: int) -> dict[str, Any]:
    from model_service.random_configs import random_config
    from radixmesh_bench.gpu.common import hf_model

    bw = copy_bandwidth_gbps()
    lus = launch_us()
    hf_cfg, _ = random_config(MODEL)
    t = time.perf_counter()
    model = hf_model(hf_cfg, torch.bfloat16, attn="sdpa")
    build_s = time.perf_counter() - t
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    ids = torch.tensor(prompts(batch, input_len, hf_cfg.vocab_size), device="cuda")
    mask = torch.ones_like(ids)

    def gen(n: int) -> tuple[float, int]:
        return hf_generate_timed(model, ids, mask, n)

    gen(min(8, output_len))  # warm-up
    total, produced = gen(output_len)
    # per-token decode estimate: difference of two lengths cancels prefill and setup
    short_n = max(2, output_len // 4)
    t_short, _ = gen(short_n)
    step_ms = (total - t_short) / (output_len - short_n) * 1e3
    floor_ms = weight_bytes / (bw * 1e9) * 1e3
    row = {
        "system": "hf-transformers",
        "variant": "generate, sdpa, bf16, greedy",
        "path": "in-process generate",
        "model": f"{MODEL} random bf16",
        "batch": batch,
        "input_len": input_len,
        "output_len": output_len,
        "tokens_produced": produced,
        "total_s": total,
        "tok_s": batch * produced / total,
        "decode_step_ms_median": step_ms,
        "decode_step_ms_note": "(t(out) - t(out/4)) / (3 out/4): mean, not median",
        "weight_floor_ms": floor_ms,
        "roofline_fraction": floor_ms / step_ms,
    }
    log(f"HF: {row['tok_s']:.1f} tok/s, ~{step_ms:.2f} ms/step")
    return {
        "copy_bandwidth_GBps": bw,
        "launch_us": lus,
        "build_s": build_s,
        "weight_bytes": weight_bytes,
        "rows": [row],
    }
