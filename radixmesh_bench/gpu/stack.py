"""Part `stack`: the whole service stack over gRPC vs the in-process ModelRunner, same run.

Workloads (random token ids from the real Llama-3.1 vocabulary sent as `input_ids`, so prompt
lengths are exact; greedy; `ignore_eos`, so every request makes exactly `output_len` tokens):

- `single`: 1 request, 128 in / 128 out
- `batch64`: 64 requests submitted at once, 128 / 256
- `offline256`: 256 requests submitted at once, 128 / 256

Two systems, one after the other so each has the GPU alone:

1. in-process: a subprocess builds the engine exactly as the model service does
   (`build_engine`, random weights, flashinfer, CUDA graphs up to batch 256) and drives
   `ModelRunner.step` directly: all requests admitted in one step, then decode steps. TTFT is
   that first step; ITL samples are the decode steps.
2. grpc-stack: the four services as separate processes (`services.launcher`): model service
   with `--random-weights`, tokenizer and grammar services on the random model's folder (its
   config.json and the Llama-3.1 tokenizer), scheduler with a larger prefill chunk. Requests go
   through `radixmesh.api.AsyncClient` streams (one token per chunk) from this process. TTFT: submit
   to first chunk; ITL: gaps between chunks (a chunk of n tokens counts as n gaps of 1/n).

Per workload the stack's row carries its overhead against the in-process row:
`overhead_vs_in_process` = 1 - stack tok/s / in-process tok/s (goal: under 0.10), the ITL p50
difference, and the model worker's own split of the burst (`step_burst` log lines: time inside
`ModelRunner.step`, and time between steps, when the GPU waits on scheduler and transport).
`idle_ms_per_step_from_wall` = client wall time per scheduler step - worker busy time per step:
the GPU's idle time per step as seen from outside.

Local check of the orchestration on CPU (tiny model, tiny workloads):

    python radixmesh_bench/gpu/stack.py --model tiny-llama --device cpu --quick --out /tmp/stack
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from radixmesh_bench.gpu.common import log, log_tails, new_doc, percentile  # noqa: E402
from radixmesh_bench.gpu.stack_inprocess import (  # noqa: E402
    graph_max_bs,
    inprocess,
    run_inprocess,
    worker_env,
)
from radixmesh_bench.report import write_json  # noqa: E402

WORKLOADS: list[dict[str, Any]] = [
    {"name": "single", "batch": 1, "input_len": 128, "output_len": 128, "seed": 11},
    {"name": "batch64", "batch": 64, "input_len": 128, "output_len": 256, "seed": 12},
    {"name": "offline256", "batch": 256, "input_len": 128, "output_len": 256, "seed": 13},
]
QUICK: list[dict[str, Any]] = [
    {"name": "single", "batch": 1, "input_len": 16, "output_len": 8, "seed": 11},
    {"name": "batch4", "batch": 4, "input_len": 16, "output_len": 12, "seed": 12},
    {"name": "offline8", "batch": 8, "input_len": 16, "output_len": 12, "seed": 13},
]
WARMUP = {"name": "warmup", "batch": 8, "input_len": 128, "output_len": 16, "seed": 99}
QUICK_WARMUP = {"name": "warmup", "batch": 2, "input_len": 16, "output_len": 4, "seed": 99}
CHUNK_TOKENS = 8192  # scheduler prefill budget per step (default 2048): 256 x 128 in 4 steps
VOCAB_TEXT = 128000  # ordinary Llama-3.1 token ids (specials start at 128000)


# -- 2. through the stack ---------------------------------------------------------------------
async def _one(client: Any, ids: list[int], output_len: int) -> dict[str, Any]:
    from radixmesh_bench.gpu.serving_client import timed_stream

    return await timed_stream(client, ids, output_len)


async def _workload_stack(endpoint: str, w: dict[str, Any]) -> dict[str, Any]:
    from radixmesh.api import AsyncClient

    from radixmesh_bench.gpu.perf import prompts

    ps = prompts(w["batch"], w["input_len"], VOCAB_TEXT, w["seed"])
    async with AsyncClient(endpoint) as c:
        s0 = await c.stats()
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(_one(c, p, w["output_len"]) for p in ps))
        wall = time.perf_counter() - t0
        s1 = await c.stats()
    toks = sum(o["completion_tokens"] for o in outs)
    ttft = [o["ttft"] * 1e3 for o in outs]
    itl = [x * 1e3 for o in outs for x in o["itl"]]
    steps = s1.steps - s0.steps
    return {
        "wall_s": wall,
        "output_tokens": toks,
        "tok_s": toks / wall,
        "ttft_ms_p50": percentile(ttft, 0.5),
        "ttft_ms_p99": percentile(ttft, 0.99),
        "itl_ms_p50": percentile(itl, 0.5),
        "itl_ms_p99": percentile(itl, 0.99),
        "itl_samples": len(itl),
        "scheduler_steps": steps,
        "wall_ms_per_step": wall * 1e3 / steps if steps else None,
        "cached_prompt_tokens": s1.cached_prompt_tokens - s0.cached_prompt_tokens,
        "all_exact_length": all(
            o["completion_tokens"] == w["output_len"] and o["prompt_tokens"] == w["input_len"]
            for o in outs
        ),
        "finish_reasons": sorted({o["finish"] for o in outs}),
        "tokens": [o["tokens"] for o in outs],
    }


_KV = re.compile(r"(\w+)=([-\d.]+)(?=\s|$)")


def _bursts(path: Path, offset: int) -> tuple[list[dict[str, float]], int]:
    """The model worker's `step_burst` log lines (key=value numbers) after `offset`."""
    if not path.exists():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    out = []
    for line in data.decode("utf-8", "replace").splitlines():
        if "step_burst" in line:
            out.append({k: float(v) for k, v in _KV.findall(line)})
    return out, offset + len(data)


def _add_burst(r: dict[str, Any], b: dict[str, float]) -> None:
    """The model worker's own split of a workload's burst (its longest `step_burst` line) into
    row `r`: time inside ModelRunner.step and between steps, per step."""
    r["worker_steps"] = b["steps"]
    r["worker_busy_ms_per_step"] = b["busy_ms"] / b["steps"]
    r["worker_between_ms_per_step"] = b["between_ms"] / max(b["steps"] - 1, 1)
    r["worker_idle_fraction"] = b["between_ms"] / (b["busy_ms"] + b["between_ms"])
    # CUDA events around each step's forward pass (model_service.step_bursts.StepBursts.account)
    for key in ("gpu_busy_ms_per_step", "gpu_idle_ms_per_step", "gpu_idle_fraction"):
        if key in b:
            r[key] = b[key]
    if r["wall_ms_per_step"]:
        r["idle_ms_per_step_from_wall"] = r["wall_ms_per_step"] - r["worker_busy_ms_per_step"]


async def _flush(endpoint: str) -> None:
    """A pause ends the worker's burst; the next step (this tiny request) logs it. The pause
    after it keeps the tiny request's steps out of the next workload's burst (the first
    on-device run of this part slept only 0.3 s there, so each burst's `between` time also
    held that pause; its `worker_between_*` / `worker_idle_fraction` figures are too high,
    while `wall_ms_per_step - worker_busy_ms_per_step` is not affected)."""
    from radixmesh.api import AsyncClient

    await asyncio.sleep(0.8)
    async with AsyncClient(endpoint) as c:
        await c.generate(input_ids=[1000, 2000, 3000], max_new_tokens=1, ignore_eos=True)
    await asyncio.sleep(0.8)


def run_stack(
    model: str,
    device: str,
    workloads: list[dict[str, Any]],
    warmup: dict[str, Any],
    log_dir: Path,
    ready_timeout: float,
    overlap: str = "on",
) -> dict[str, Any]:
    from radixmesh_bench.stack import launcher_for, random_model_args, running
    from services.launcher import StackPorts, stack_specs

    model_dir, model_args = random_model_args(model, device, graph_max_bs(workloads))
    ports = StackPorts.free()
    sched_args = [
        "--chunk-tokens",
        str(CHUNK_TOKENS),
        "--overlap",
        overlap,
        "--max-running",
        str(max(256, max(w["batch"] for w in workloads))),
    ]
    specs = stack_specs(ports, str(model_dir), model_args=model_args, scheduler_args=sched_args)
    launcher = launcher_for(specs, log_dir, env=worker_env(workloads))
    res: dict[str, Any] = {
        "model_dir": str(model_dir),
        "model_args": model_args,
        "scheduler_args": sched_args,
        "log_dir": str(log_dir),
        "rows": [],
        "tokens": {},
    }
    endpoint = f"127.0.0.1:{ports.tokenizer}"
    mlog = log_dir / "model.log"
    t = time.perf_counter()
    with running(launcher, timeout=ready_timeout):
        res["ready_s"] = time.perf_counter() - t
        log(f"stack ready in {res['ready_s']:.1f}s (logs in {log_dir})")
        asyncio.run(_workload_stack(endpoint, warmup))
        asyncio.run(_flush(endpoint))
        _, offset = _bursts(mlog, 0)
        for w in workloads:
            r = asyncio.run(_workload_stack(endpoint, w))
            asyncio.run(_flush(endpoint))
            bursts, offset = _bursts(mlog, offset)
            if bursts:
                _add_burst(r, max(bursts, key=lambda x: x["steps"]))
            res["tokens"][w["name"]] = r.pop("tokens")
            res["rows"].append(
                {
                    "system": "radixmesh",
                    "variant": f"4 services over gRPC, overlap {overlap}",
                    "overlap": overlap,
                    "path": "grpc-stack",
                    "model": f"{model} random",
                    "workload": w["name"],
                    "batch": w["batch"],
                    "input_len": w["input_len"],
                    "output_len": w["output_len"],
                    **r,
                }
            )
            log(
                f"stack (overlap {overlap}) {w['name']}: {r['tok_s']:.1f} tok/s, TTFT p50 "
                f"{r['ttft_ms_p50']:.1f} ms, ITL p50 {r['itl_ms_p50']:.2f} p99 "
                f"{r['itl_ms_p99']:.2f} ms, GPU idle "
                f"{r.get('gpu_idle_fraction', float('nan')):.3f} of step time"
            )
    return res


def _agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, float]:
    """Greedy tokens of the two paths: first-token match and mean common-prefix fraction
    (bf16 logits of random weights have tiny margins, so batch shape can flip a token)."""
    if not a or len(a) != len(b):
        return {}
    first = sum(1.0 for x, y in zip(a, b, strict=True) if x[:1] == y[:1]) / len(a)
    pref = []
    for x, y in zip(a, b, strict=True):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        pref.append(n / max(len(x), 1))
    return {"first_token_agreement": first, "common_prefix_fraction": sum(pref) / len(pref)}


def _stack_rows(
    doc: dict[str, Any],
    out: Path,
    tmp: Path,
    model: str,
    device: str,
    workloads: list[dict[str, Any]],
    quick: bool,
    ready_timeout: float,
    overlap: str,
    inproc_tokens: dict[str, Any],
) -> bool:
    """One stack (scheduler `--overlap on|off`): its rows, each set against in-process."""
    base = out / "stack_logs" if os.environ.get("STACK_KEEP_LOGS") else tmp / "logs"
    log_dir = base / f"overlap_{overlap}"
    try:
        st = run_stack(
            model,
            device,
            workloads,
            QUICK_WARMUP if quick else WARMUP,
            log_dir,
            ready_timeout,
            overlap,
        )
    except Exception as exc:  # record, keep what the other runs measured
        import traceback

        traceback.print_exc()
        doc["errors"].append(f"stack (overlap {overlap}): {exc!r}")
        doc["notes"] += log_tails(log_dir)
        return False
    stack_tokens = st.pop("tokens")
    rows = st.pop("rows")
    doc[f"stack_overlap_{overlap}"] = st
    by_name = {r["workload"]: r for r in doc["rows"] if r["path"] == "in-process ModelRunner"}
    ok = True
    for r in rows:
        ref = by_name.get(r["workload"])
        if ref:
            r["in_process_tok_s"] = ref["tok_s"]
            r["overhead_vs_in_process"] = 1 - r["tok_s"] / ref["tok_s"]
            r["itl_p50_minus_in_process_ms"] = r["itl_ms_p50"] - ref["itl_ms_p50"]
            r["within_10pct"] = r["overhead_vs_in_process"] <= 0.10
            r.update(
                _agreement(
                    inproc_tokens.get(r["workload"], []), stack_tokens.get(r["workload"], [])
                )
            )
        ok &= bool(r["all_exact_length"])
        doc["rows"].append(r)
    return ok


def part_stack(
    out: Path,
    model: str = "llama-3.1-8b",
    device: str = "cuda",
    quick: bool = False,
    inprocess_timeout: float = 240,
    ready_timeout: float = 240,
) -> bool:
    workloads = QUICK if quick else WORKLOADS
    doc = new_doc("stack")
    doc["workloads"] = workloads
    doc["notes"].append(
        f"scheduler --chunk-tokens {CHUNK_TOKENS}; client streams one token "
        "per chunk; prompts are random ids < 128000 sent as input_ids"
    )
    ok = True
    with tempfile.TemporaryDirectory(prefix="radixmesh-stack-") as td:
        tmp = Path(td)
        inp = run_inprocess(model, device, workloads, tmp, inprocess_timeout)
        inproc_tokens: dict[str, Any] = {}
        if "error" in inp:
            doc["errors"].append(inp["error"])
            ok = False
        else:
            inproc_tokens = inp.pop("tokens", {})
            doc["rows"].extend(inp.pop("rows"))
            doc["worker_inprocess"] = inp
            if "copy_bandwidth_GBps" in inp:
                doc["copy_bandwidth_GBps"] = inp["copy_bandwidth_GBps"]
        write_json(doc, out / "stack.json")
        for overlap in ("on", "off"):
            ok &= _stack_rows(
                doc,
                out,
                tmp,
                model,
                device,
                workloads,
                quick,
                ready_timeout,
                overlap,
                inproc_tokens,
            )
            write_json(doc, out / "stack.json")
    for r in doc["rows"]:
        extra = (
            f" overhead {r['overhead_vs_in_process']:+.3f}" if "overhead_vs_in_process" in r else ""
        )
        log(
            f"{r['path']:24s} {r.get('overlap', '-'):3s} {r['workload']:10s} {r['tok_s']:9.1f} "
            f"tok/s  TTFT p50/p99 "
            f"{r['ttft_ms_p50']:8.1f}/{r['ttft_ms_p99']:8.1f} ms  ITL p50/p99 "
            f"{r['itl_ms_p50']:6.2f}/{r['itl_ms_p99']:6.2f} ms{extra}"
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny workloads (local check)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/gpu")))
    ap.add_argument("--inprocess-worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--workloads-file", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inprocess_worker:
        assert args.workloads_file is not None
        res = inprocess(args.model, args.device, json.loads(args.workloads_file.read_text()))
        args.inprocess_worker.write_text(json.dumps(res, default=str))
        return 0
    return 0 if part_stack(args.out, args.model, args.device, args.quick) else 1


if __name__ == "__main__":
    sys.exit(main())
