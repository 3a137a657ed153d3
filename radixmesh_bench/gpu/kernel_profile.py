"""Part `profile`: where one batch-1 decode step of Llama-3.1-8B goes, separate vs fused layers.

One process builds the random 8B model in the separate form (`RADIXMESH_FUSE=0`, as before the
fusion work), measures it, fuses it in place (`LlamaForCausalLM.fuse()`) with torch
element-wise ops and measures, then switches to the Triton element-wise kernels (the form the
service runs on CUDA) and measures again (batch 1 and 64), then once more with decode attention
on CUDA cores instead of tensor cores, so all see the same weights, GPU and KV. Per form:

- `graph_replay_gpu_ms`: GPU time of one replay of the batch-1 decode graph (median of 30).
- `decode_step_ms_median`: a whole `ModelRunner.step` (host work, replay, sampling) at batch 1,
  context 128..191, median of 64 steps; `tok_s` = 1000 / that.
- `kernels`: torch.profiler over 10 graph replays (CUPTI reports the kernels inside a graph):
  per kernel name, calls and GPU microseconds per step; `kernel_sum_ms` is their sum and
  `categories` groups them (matmul, attention, norm, element-wise, copies, other).
- `gemv`: each projection alone at batch 1 (bf16, `F.linear`), the 32 layers' weights in turn
  inside one CUDA graph (so the 8-117 MB matrices are not served from the 50 MB L2), time per
  call against its byte floor (weight bytes / copy bandwidth measured in the same process).

The floor of a step is all weight bytes once (plus the KV read, 16 MB at context 128) over the
copy bandwidth; the embedding table counts once in `weight_floor_ms` (as in decode1) and as one
row in `bytes_floor_ms`.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from typing import Any

import torch

from radixmesh_bench.gpu.common import copy_bandwidth_gbps, log, replay_ms

MODEL = "llama-3.1-8b"
CATEGORIES = (
    (
        "attention",
        re.compile(
            r"flashinfer|BatchDecode|BatchPrefill|Persistent|attention|"
            r"MergeStates|VariableLength",
            re.I,
        ),
    ),
    ("matmul", re.compile(r"gemv|gemm|nvjet|cutlass|xmma|splitk|cublas", re.I)),
    ("norm", re.compile(r"rms|norm", re.I)),
    ("copy/index", re.compile(r"index|copy|memcpy|memset|gather|scatter|flip|cat", re.I)),
    ("element-wise", re.compile(r"rope|elementwise|Functor|unrolled|silu|mul|add|reduce", re.I)),
)


def _category(name: str) -> str:
    for cat, rx in CATEGORIES:
        if rx.search(name):
            return cat
    return "other"


def _kernels(run: Any, reps: int = 10) -> tuple[list[dict[str, Any]], float]:
    """Kernels of `reps` calls of run(i), per call."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            run(i)
        torch.cuda.synchronize()
    sums: dict[str, list[float]] = {}
    for ev in prof.events():
        if getattr(ev, "device_type", None) != DeviceType.CUDA:
            continue
        us = float(ev.time_range.elapsed_us())
        acc = sums.setdefault(ev.name, [0, 0.0])
        acc[0] += 1
        acc[1] += us
    rows: list[dict[str, Any]] = [
        {
            "kernel": name[:160],
            "category": _category(name),
            "calls_per_step": n / reps,
            "us_per_step": us / reps,
        }
        for name, (n, us) in sorted(sums.items(), key=lambda kv: -kv[1][1])
        if us > 0
    ]
    return rows, sum(float(r["us_per_step"]) for r in rows) / 1e3


def _gemv(model: Any, bw_gbps: float) -> list[dict[str, Any]]:
    """Each projection of every layer once per replay, batch 1; ms per call vs byte floor."""
    layers = model.model.layers
    a0, m0 = layers[0].self_attn, layers[0].mlp
    names = [n for n in ("qkv_proj", "q_proj", "k_proj", "v_proj", "o_proj") if hasattr(a0, n)]
    mnames = [n for n in ("gate_up_proj", "gate_proj", "up_proj", "down_proj") if hasattr(m0, n)]
    groups: list[tuple[str, list[torch.Tensor]]] = []
    groups += [(n, [getattr(layer.self_attn, n).weight for layer in layers]) for n in names]
    groups += [(n, [getattr(layer.mlp, n).weight for layer in layers]) for n in mnames]
    groups.append(("lm_head", [model.lm_head.weight]))
    out = []
    for name, ws in groups:
        x = torch.randn(1, ws[0].shape[1], dtype=ws[0].dtype, device=ws[0].device)
        with torch.inference_mode():
            for w in ws:  # warm-up, outside the graph
                torch.nn.functional.linear(x, w)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                ys = [torch.nn.functional.linear(x, w) for w in ws]
        ms = replay_ms(g, 20) / len(ws)
        del ys, g
        nbytes = ws[0].numel() * ws[0].element_size()
        floor = nbytes / (bw_gbps * 1e9) * 1e3
        out.append(
            {
                "proj": name,
                "shape": list(ws[0].shape),
                "MB": nbytes / 1e6,
                "ms_per_call": ms,
                "floor_ms": floor,
                "fraction_of_floor": floor / ms,
                "GBps": nbytes / ms / 1e6,
                "calls_per_step": len(ws),
            }
        )
    return out


def _measure(
    runner: Any,
    graphs: Any,
    bw: float,
    weight_bytes: int,
    embed_bytes: int,
    kv_per_tok: int,
    label: str,
    batch: int = 1,
) -> dict[str, Any]:
    from radixmesh_wire.step_ops import AdmitOp, Sampling, StepOps

    n_in, n_dec = 128, 64
    span = n_in + n_dec + 8  # slots per request: prompt, then its decodes
    gen = torch.Generator().manual_seed(5)
    admits = []
    for b in range(batch):
        ids = torch.randint(0, 128000, (n_in,), generator=gen).tolist()
        admits.append(
            AdmitOp(
                1 + b,
                Sampling(temperature=0.0),
                0,
                [],
                ids,
                list(range(b * span, b * span + n_in)),
                True,
            )
        )
    handles = [1 + b for b in range(batch)]
    runner.step(StepOps(1, admits=admits))
    times = []
    for j in range(n_dec):
        torch.cuda.synchronize()
        t = time.perf_counter()
        runner.step(
            StepOps(
                2 + j,
                decode_handles=handles,
                decode_slots=[b * span + n_in + j for b in range(batch)],
            )
        )
        times.append((time.perf_counter() - t) * 1e3)
    g = graphs.graphs[graphs.bucket_for(batch)].graph  # planned for the last step
    replay = replay_ms(g)
    kernels, ksum = _kernels(lambda i: g.replay())
    source = "graph replay"
    if not kernels:  # this profiler saw no kernels inside the graph: profile eager steps
        runner.decode_graphs = None
        base = n_in + n_dec

        def eager(i: int) -> None:
            runner.step(
                StepOps(
                    100 + i,
                    decode_handles=handles,
                    decode_slots=[b * span + base + i for b in range(batch)],
                )
            )

        kernels, ksum = _kernels(eager, reps=5)
        runner.decode_graphs = graphs
        source = "eager steps (no kernels seen inside the graph)"
    runner.step(StepOps(2 + n_dec, releases=handles))
    cats: dict[str, float] = {}
    for k in kernels:
        cats[k["category"]] = cats.get(k["category"], 0.0) + k["us_per_step"] / 1e3
    floor = weight_bytes / (bw * 1e9) * 1e3
    need = weight_bytes - embed_bytes + batch * (n_in + n_dec) * kv_per_tok
    bytes_floor = need / (bw * 1e9) * 1e3
    step = statistics.median(times)
    res = {
        "form": label,
        "batch": batch,
        "graph_replay_gpu_ms": replay,
        "decode_step_ms_median": step,
        "tok_s": batch * 1e3 / step,
        "host_ms_per_step": step - replay,
        "kernel_sum_ms": ksum,
        "kernels_per_step": sum(k["calls_per_step"] for k in kernels),
        "categories_ms": cats,
        "weight_floor_ms": floor,
        "bytes_floor_ms": bytes_floor,
        "roofline_fraction_gpu_forward": floor / replay,
        "roofline_fraction_step": floor / step,
        "kernel_source": source,
        "kernels": kernels[:40],
    }
    log(
        f"{label} batch {batch}: replay {replay:.3f} ms, step {step:.3f} ms "
        f"({batch * 1e3 / step:.1f} tok/s), "
        f"{res['kernels_per_step']:.0f} kernels, kernel sum {ksum:.3f} ms, floor {floor:.3f} ms"
    )
    for c, v in sorted(cats.items(), key=lambda kv: -kv[1]):
        log(f"   {c:14s} {v:7.3f} ms")
    return res


def worker_profile() -> dict[str, Any]:
    from model_service.config import ModelServiceConfig
    from model_service.cuda_graphs import capture_decode_graphs
    from model_service.engine import build_engine

    os.environ["RADIXMESH_FUSE"] = "0"
    bw = copy_bandwidth_gbps()
    eng = build_engine(
        ModelServiceConfig(
            random_weights=MODEL,
            device="cuda",
            dtype="bfloat16",
            attention="flashinfer",
            kv_tokens=16384,
            cuda_graph_max_bs=1,
        )
    )
    runner = eng.runner
    model = runner.model
    a = model.args
    assert not model.fused and runner.decode_graphs is not None
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    embed_bytes = model.model.embed_tokens.weight.numel() * 2
    kv_per_tok = 2 * a.num_layers * a.num_kv_heads * a.head_dim * 2
    res: dict[str, Any] = {"copy_bandwidth_GBps": bw, "weight_bytes": weight_bytes, "forms": []}
    log(f"copy bandwidth {bw:.0f} GB/s; weights {weight_bytes / 1e9:.2f} GB")
    sep = _measure(
        runner, runner.decode_graphs, bw, weight_bytes, embed_bytes, kv_per_tok, "separate (before)"
    )
    sep["gemv"] = _gemv(model, bw)
    res["forms"].append(sep)

    def measure_at(batch: int, label: str) -> dict[str, Any]:
        """Capture one decode graph for `batch` rows in the model's current form, measure it."""
        runner.decode_graphs = None
        torch.cuda.empty_cache()
        attn: Any = runner.attn  # flashinfer here (the engine was built with it)
        graphs = capture_decode_graphs(
            model,
            attn,
            scratch_slot=runner.pool.capacity,
            max_kv_tokens=runner.pool.capacity,
            buckets=[batch],
        )
        runner.decode_graphs = graphs
        return _measure(
            runner, graphs, bw, weight_bytes, embed_bytes, kv_per_tok, label, batch=batch
        )

    for kernels in ("torch", "triton"):
        runner.decode_graphs = None
        torch.cuda.synchronize()
        model.fuse(kernels)
        if model.ops.name != kernels:
            res.setdefault("notes", []).append(f"{kernels}: {model.ops_note}")
            log(f"fused with {kernels} ops: not available ({model.ops_note})")
            continue
        fused = measure_at(1, f"fused, {kernels} ops")
        if kernels == "torch":
            fused["gemv"] = _gemv(model, bw)
        res["forms"].append(fused)
        if kernels == "triton":  # the batch-64 step: where its time goes against its floor
            res["forms"].append(measure_at(64, f"fused, {kernels} ops"))
    if model.ops.name == "triton":  # decode attention on CUDA cores instead of tensor cores
        attn: Any = runner.attn
        attn.tensor_cores = False
        for batch in (1, 64):
            try:
                res["forms"].append(measure_at(batch, "fused, triton ops, CUDA-core decode"))
            except Exception as exc:  # the CUDA-core kernel may not build for this shape
                res.setdefault("notes", []).append(f"CUDA-core decode: {exc!r}"[:300])
                log(f"CUDA-core decode graph failed: {exc!r}")
                break
        attn.tensor_cores = True
    for f in res["forms"]:
        for gm in f.get("gemv", []):
            log(
                f"{f['form']:18s} {gm['proj']:13s} {str(gm['shape']):15s} {gm['MB']:7.1f} MB "
                f"{gm['ms_per_call'] * 1e3:7.1f} us  floor {gm['floor_ms'] * 1e3:6.1f} us "
                f"({gm['fraction_of_floor']:.2f}, {gm['GBps']:.0f} GB/s)"
            )
    return res
