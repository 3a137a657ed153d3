"""Part `stack`, system 1: the in-process ModelRunner (radixmesh_bench/gpu/stack.py compares it
with the four services over gRPC in the same run).

A subprocess (`stack.py --inprocess-worker`) builds the engine exactly as the model service does
(`build_engine`, random weights, flashinfer, CUDA graphs up to the largest batch) and drives
`ModelRunner.step` directly: all requests admitted in one step, then decode steps. TTFT is that
first step; ITL samples are the decode steps."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from radixmesh_bench.gpu.common import json_worker, log


def graph_max_bs(workloads: list[dict[str, Any]]) -> int:
    """--cuda-graph-max-bs for both paths: every workload's decode batch replays a graph."""
    return max(128, max(w["batch"] for w in workloads))


def worker_env(workloads: list[dict[str, Any]]) -> dict[str, str]:
    return {"PYTHONUNBUFFERED": "1"}


# -- 1. in-process ----------------------------------------------------------------------------
def inprocess(model: str, device: str, workloads: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs in its own process: build the engine as the model service does, then each
    workload (after a short warm-up of the same shape) through ModelRunner.step."""
    import torch

    from model_service.config import ModelServiceConfig
    from model_service.engine import build_engine
    from radixmesh_bench.gpu.perf import _workload, launch_us

    res: dict[str, Any] = {"rows": []}
    if device == "cuda":
        from radixmesh_bench.gpu.common import copy_bandwidth_gbps

        res["copy_bandwidth_GBps"] = copy_bandwidth_gbps()
        res["launch_us"] = launch_us()
    t = time.perf_counter()
    cfg = ModelServiceConfig(
        random_weights=model,
        device=device,
        attention="flashinfer" if device == "cuda" else "reference",
        cuda_graph_max_bs=graph_max_bs(workloads),
    )
    eng = build_engine(cfg)
    res["build_s"] = time.perf_counter() - t
    runner = eng.runner
    graphs = runner.decode_graphs
    res.update(
        attention=eng.attention_backend,
        kv_tokens=runner.pool.capacity,
        fused=runner.model.fused,
        kernels_note=runner.model.ops_note,
        kernels=runner.model.ops.name if runner.model.ops else "-",
        cuda_graph_buckets=graphs.buckets if graphs else [],
    )
    log(
        f"in-process engine built in {res['build_s']:.1f}s: {res['attention']}, "
        f"graphs {res['cuda_graph_buckets']}, fused {res['fused']}"
    )
    sid = 0
    for w in workloads:
        _workload(runner, w["batch"], w["input_len"], min(8, w["output_len"]), sid, seed=999)
        sid += 100
        replays0 = graphs.replays if graphs else 0
        r = _workload(runner, w["batch"], w["input_len"], w["output_len"], sid, seed=w["seed"])
        sid += w["output_len"] + 10
        tokens = r.pop("tokens")
        row = {
            "system": "radixmesh",
            "variant": variant(eng.attention_backend, graphs),
            "path": "in-process ModelRunner",
            "model": f"{model} random",
            "workload": w["name"],
            "batch": w["batch"],
            "input_len": w["input_len"],
            "output_len": w["output_len"],
            **r,
            "ttft_ms_p50": r["prefill_ms"],
            "ttft_ms_p99": r["prefill_ms"],
            "itl_ms_p50": r["decode_step_ms_median"],
            "itl_ms_p99": r["decode_step_ms_p99"],
            "graph_replays": (graphs.replays - replays0) if graphs else 0,
            "first_tokens": [t[:8] for t in tokens[:4]],
        }
        res["rows"].append(row)
        res.setdefault("tokens", {})[w["name"]] = tokens
        row["kernels"] = res["kernels"]
        log(
            f"in-process {w['name']}: {r['tok_s']:.1f} tok/s, prefill {r['prefill_ms']:.1f} ms, "
            f"decode step p50 {r['decode_step_ms_median']:.2f} ms"
        )
    del runner, eng
    if device == "cuda":
        torch.cuda.empty_cache()
    return res


def variant(attention: str, graphs: Any) -> str:
    return f"{attention}+cuda-graphs" if graphs else f"{attention} eager"


def run_inprocess(
    model: str, device: str, workloads: list[dict[str, Any]], tmp: Path, timeout: float
) -> dict[str, Any]:
    path = tmp / "inprocess.json"
    wl = tmp / "workloads.json"
    wl.write_text(json.dumps(workloads))
    cmd = [
        sys.executable,
        str(Path(__file__).with_name("stack.py")),  # its --inprocess-worker runs `inprocess`
        "--inprocess-worker",
        str(path),
        "--model",
        model,
        "--device",
        device,
        "--workloads-file",
        str(wl),
    ]
    env = {**os.environ, **worker_env(workloads)}
    return json_worker(cmd, path, timeout, "in-process worker", env)
