"""GPU benchmark and numerics check, in named parts that each finish within a few minutes.
Run as `python radixmesh_bench/gpu/run.py --part NAME --out DIR`:

    run.py --part check   --out DIR   # logits vs HF fp32/bf16, 3 attention paths
    run.py --part test    --out DIR   # pytest tests/gpu
    run.py --part decode1 --out DIR   # batch 1, 128 in / 128 out, ours vs HF
    run.py --part batch64 --out DIR   # batch 64, 128 in / 256 out, ours vs HF
    run.py --part profile --out DIR   # batch-1 decode step: kernels, GEMVs,
                                      # separate vs fused layers
    run.py --part stack   --out DIR   # 4 services over gRPC vs in-process
    run.py --part sharegpt --out DIR  # ShareGPT 2,000 prompts, rate inf; HF
    run.py --part gsp     --out DIR   # generated-shared-prefix, radix on/off
    run.py --part mmlu    --out DIR   # 5-shot MMLU-style, radix on/off
                                      # (these three: serving.py)
    run.py --part constrained --out DIR  # JSON-schema batches 1/16/64 vs
                                      # unconstrained, jump-forward off/on
    run.py --part model_load --out DIR  # the model service alone, batch 1-256
    run.py --part startup --out DIR   # start-up errors: weights too big, KV too
                                      # small, unsupported architecture, flashinfer
                                      # missing (startup_part.py)
    run.py --part host_tier --out DIR # host KV tier: link peak, tier copy GB/s,
                                      # multi-turn and gsp tier off / write-back /
                                      # write-through (host_tier_part.py)
    run.py --part all     --out DIR

Each part writes DIR/<part>.json (radixmesh_bench/gpu/common.py describes the format); copy them
into results/gpu/ and render with `python radixmesh_bench/gpu/merge.py results/gpu/*.json`.
Throughput parts run every system in its own subprocess (`--worker ours|hf`), one after the other,
so each sees the whole GPU; a worker that fails or hangs is recorded in `errors` and the part goes
on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from radixmesh_bench.gpu.common import log, new_doc  # noqa: E402
from radixmesh_bench.report import write_json  # noqa: E402

PARTS = {
    "check": {},
    "test": {},
    "decode1": {"batch": 1, "input_len": 128, "output_len": 128},
    "batch64": {"batch": 64, "input_len": 128, "output_len": 256},
    "profile": {},
    "stack": {},
    "sharegpt": {},
    "gsp": {},
    "mmlu": {},
    "constrained": {},
    "model_load": {},
    "startup": {},
    "host_tier": {},
}
WORKER_TIMEOUT_S = 330


def run_worker(
    kind: str, batch: int, input_len: int, output_len: int, tmp: Path, timeout: float
) -> dict:
    path = tmp / f"{kind}.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        kind,
        "--batch",
        str(batch),
        "--input-len",
        str(input_len),
        "--output-len",
        str(output_len),
        "--json",
        str(path),
    ]
    log(f"worker {kind}: {' '.join(cmd[1:])}")
    t = time.perf_counter()
    rc: int | str
    try:
        rc = subprocess.run(cmd, timeout=timeout, cwd=ROOT).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    wall = time.perf_counter() - t
    if rc != 0 or not path.exists():
        return {"error": f"worker {kind} exited with {rc} after {wall:.0f}s"}
    res = json.loads(path.read_text())
    res["worker_wall_s"] = wall
    return res


def part_perf(name: str, out: Path, systems: list[str]) -> bool:
    spec = PARTS[name]
    doc = new_doc(name)
    doc["workload"] = spec
    ok = True
    with tempfile.TemporaryDirectory() as td:
        for kind in systems:
            res = run_worker(
                kind,
                spec["batch"],
                spec["input_len"],
                spec["output_len"],
                Path(td),
                WORKER_TIMEOUT_S,
            )
            if "error" in res:
                doc["errors"].append(res["error"])
                ok = False
                continue
            rows = res.pop("rows")
            doc["rows"].extend(rows)
            doc[f"worker_{kind}"] = res
            write_json(doc, out / f"{name}.json")  # keep partial results
    bws = [doc[k]["copy_bandwidth_GBps"] for k in doc if k.startswith("worker_")]
    if bws:
        doc["copy_bandwidth_GBps"] = max(bws)
    ours = [r for r in doc["rows"] if r["system"] == "radixmesh"]
    hf = [r for r in doc["rows"] if r["system"] == "hf-transformers"]
    if ours and hf:
        best = max(ours, key=lambda r: r["tok_s"])
        doc["speedup_vs_hf"] = best["tok_s"] / hf[0]["tok_s"]
    write_json(doc, out / f"{name}.json")
    return ok


def part_profile(out: Path) -> bool:
    doc = new_doc("profile")
    with tempfile.TemporaryDirectory() as td:
        res = run_worker("profile", 1, 128, 64, Path(td), WORKER_TIMEOUT_S)
    if "error" in res:
        doc["errors"].append(res["error"])
        write_json(doc, out / "profile.json")
        return False
    doc["copy_bandwidth_GBps"] = res["copy_bandwidth_GBps"]
    doc["profile"] = res
    for f in res["forms"]:
        doc["rows"].append(
            {
                "system": "radixmesh",
                "variant": f"flashinfer+cuda-graphs, {f['form']} layers",
                "path": "in-process ModelRunner",
                "model": "llama-3.1-8b random bf16",
                "batch": 1,
                "input_len": 128,
                "output_len": 64,
                **{k: v for k, v in f.items() if k not in ("kernels", "gemv", "form")},
                "roofline_fraction": f["roofline_fraction_step"],
            }
        )
    write_json(doc, out / "profile.json")
    return True


def part_check(out: Path) -> bool:
    from radixmesh_bench.gpu.check import run_check

    doc = new_doc("check")
    try:
        ok = run_check(doc)
    except Exception as exc:
        import traceback

        traceback.print_exc()
        doc["errors"].append(repr(exc))
        ok = False
    write_json(doc, out / "check.json")
    for r in doc["rows"]:
        log(
            f"check {r['system']:16s} {r['variant']:36s} rel_err {r['rel_err']:.3e} "
            f"ratio {r['ratio_vs_hf_bf16']:.3f} nan {r['nan']} argmax {r['argmax_agree']:.3f}"
        )
    log(
        f"check pass={ok} fi_vs_ref={doc.get('flashinfer_vs_reference_rel')} "
        f"graphs_vs_eager={doc.get('graphs_vs_eager_rel')}"
    )
    return ok


def part_test(out: Path) -> bool:
    doc = new_doc("test")
    t = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/gpu",
            "tests/unit/test_runner_pipeline.py",
            "-rs",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    print(tail, flush=True)
    doc["rows"].append(
        {
            "system": "radixmesh",
            "variant": "pytest tests/gpu",
            "returncode": proc.returncode,
            "wall_s": time.perf_counter() - t,
            "summary": tail.strip().splitlines()[-1] if tail.strip() else "",
        }
    )
    write_json(doc, out / "test.json")
    return proc.returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--part", choices=[*PARTS, "all"])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/gpu")))
    ap.add_argument("--systems", default="ours,hf", help="throughput parts: ours,hf")
    ap.add_argument("--worker", choices=["ours", "hf", "profile"], help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    if args.worker:
        if not args.json:
            ap.error("--worker needs --json")
        from radixmesh_bench.gpu import perf

        if args.worker == "profile":
            from radixmesh_bench.gpu.kernel_profile import worker_profile

            res = worker_profile()
        else:
            fn = perf.worker_ours if args.worker == "ours" else perf.worker_hf
            res = fn(args.batch, args.input_len, args.output_len)
        args.json.write_text(json.dumps(res, default=str))
        return 0
    if not args.part:
        ap.error("--part is required")
    parts = list(PARTS) if args.part == "all" else [args.part]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    ok = True
    for p in parts:
        t = time.perf_counter()
        log(f"=== part {p}")
        if p == "check":
            ok &= part_check(args.out)
        elif p == "test":
            ok &= part_test(args.out)
        elif p == "profile":
            ok &= part_profile(args.out)
        elif p == "stack":
            from radixmesh_bench.gpu.stack import part_stack

            ok &= part_stack(args.out)
        elif p in ("sharegpt", "gsp", "mmlu"):
            from radixmesh_bench.gpu.serving import run_part

            ok &= run_part(p, args.out)
        elif p == "constrained":
            from radixmesh_bench.gpu.constrained_gpu import part_constrained

            ok &= part_constrained(args.out)
        elif p == "model_load":
            from radixmesh_bench.gpu.model_load_part import part_model_load

            ok &= part_model_load(args.out)
        elif p == "startup":
            from radixmesh_bench.gpu.startup_part import part_startup

            ok &= part_startup(args.out)
        elif p == "host_tier":
            from radixmesh_bench.gpu.host_tier_part import part_host_tier

            ok &= part_host_tier(args.out)
        else:
            ok &= part_perf(p, args.out, systems)
        log(f"=== part {p} done in {time.perf_counter() - t:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
