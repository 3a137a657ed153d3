"""Parts `sharegpt`, `gsp`, `mmlu`: serving workloads through the whole stack over gRPC.

    python radixmesh_bench/gpu/serving.py --part sharegpt|gsp|mmlu [--out DIR]        # on the GPU
    python radixmesh_bench/gpu/serving.py --part gsp --model tiny-llama --device cpu --quick --out
    /tmp/x

(`radixmesh_bench/gpu/run.py --part NAME` runs the same.) The four services run as processes
(`services.launcher`, as part `stack` starts them: `--random-weights llama-3.1-8b`,
flashinfer, CUDA graphs up to `--max-running`, scheduler `--chunk-tokens 8192`); every request of a
run is submitted at once (request rate inf) through `AsyncClient` streams with `input_ids`,
greedy, EOS ignored, so each makes exactly its output length. Workloads:
radixmesh_bench/gpu/serving_workloads.py.

- `sharegpt`: the 2,000 committed ShareGPT requests (radixmesh_bench/data/sharegpt_2000.json.gz)
  with
  `--radix tree` (the no-reuse case the radix bookkeeping share is judged on); then, after a
  scheduler restart (cold cache), the first `--hf-subset` of them, and HF transformers on that
  same subset in its own process (radixmesh_bench/gpu/hf_serving.py), after the stack has stopped.
- `gsp`: SGLang's generated-shared-prefix workload (64 groups x 16 prompts, 2,048-token system
  prompt, 128-token question, 256 out), `--radix tree` and then `--radix off` (scheduler
  restarted, model process kept).
- `mmlu`: MMLU-style 5-shot prompts (16 subjects x 64 questions, one shared few-shot prefix per
  subject, 1 output token), `--radix tree` then `--radix off`.

Per run: request and output-token throughput, prompt tokens per second (all, and computed =
not served from cache), TTFT / ITL / end-to-end p50 and p99, the hit rate from GetStats next to
the offline optimum, radix bookkeeping seconds (GetStats `radix_seconds`) as a share of the
run's wall time, scheduler steps, evictions, retractions, and on the GPU the roofline fraction:
(the larger of the bandwidth and compute floors for the steps taken) / wall time, with copy
bandwidth and bf16 matmul rate measured in the same call (serving_workloads.floors).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from radixmesh_bench.gpu import serving_workloads as wl  # noqa: E402
from radixmesh_bench.gpu.common import json_worker, log, new_doc  # noqa: E402
from radixmesh_bench.gpu.serving_client import drive, summarize  # noqa: E402
from radixmesh_bench.gpu.serving_stack import ServingStack  # noqa: E402
from radixmesh_bench.report import write_json  # noqa: E402

PARTS = ("sharegpt", "gsp", "mmlu")
HF_SUBSET = 64  # first requests of the sample; one static HF batch (see hf_serving.py)
QUICK_SHAREGPT = 12  # quick CPU runs: requests, and their output lengths capped at:
QUICK_MAX_OUTPUT = 12


# -- measurements in a subprocess (the parent runs no GPU work; each system gets the GPU alone) --
def measure_worker() -> dict[str, float]:
    import torch

    from radixmesh_bench.gpu.common import copy_bandwidth_gbps

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    return {
        "copy_bandwidth_GBps": copy_bandwidth_gbps(),
        "matmul_TFLOPs": 2 * 8192**3 / times[len(times) // 2] / 1e12,
    }


def _subprocess_json(args: list[str], timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as td:
        path = Path(td) / "out.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), *args, "--json", str(path)]
        return json_worker(cmd, path, timeout, args[0])


class Part:
    """One part's document, its stack and its measurements."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name, self.args = name, args
        self.doc = new_doc(name)
        self.doc["config"] = {
            "model": args.model,
            "device": args.device,
            "quick": args.quick,
            "max_running": args.max_running,
            "chunk_tokens": ServingStack.CHUNK_TOKENS,
        }
        self.path = args.out / f"{name}.json"
        self.consts: dict[str, float] = {}
        if args.device.startswith("cuda"):
            m = _subprocess_json(["--measure-worker"], 120)
            if "error" in m:
                self.doc["errors"].append(m["error"])
            else:
                self.doc.update(
                    copy_bandwidth_GBps=m["copy_bandwidth_GBps"], matmul_TFLOPs=m["matmul_TFLOPs"]
                )
                from model_service.random_configs import config_dict

                self.consts = wl.model_bytes(config_dict(args.model))
                self.doc["model_constants"] = self.consts
                log(
                    f"copy {m['copy_bandwidth_GBps']:.0f} GB/s, bf16 matmul "
                    f"{m['matmul_TFLOPs']:.0f} TFLOP/s"
                )

    def save(self) -> None:
        write_json(self.doc, self.path)

    def stack(self, log_dir: Path) -> ServingStack:
        a = self.args
        return ServingStack(a.model, a.device, log_dir, a.max_running)

    def run(
        self,
        stack: ServingStack,
        workload: str,
        reqs: list[wl.Req],
        radix: str,
        optimum: float | None,
    ) -> dict[str, Any] | None:
        t = time.perf_counter()
        try:
            stack.warmup(self.args.quick)
            res = asyncio.run(drive(stack.endpoint, reqs))
        except Exception as exc:  # record, keep the rest of the part
            import traceback

            traceback.print_exc()
            self.doc["errors"].append(f"{workload} radix {radix}: {exc!r}")
            self.doc["notes"] += stack.log_tails()
            self.save()
            return None
        row = {
            "table": "serving",
            "system": "radixmesh",
            "variant": f"radix {radix}",
            "path": "grpc-stack",
            "model": f"{self.args.model} random",
            "workload": workload,
            **summarize(reqs, res),
        }
        if optimum is not None:
            row["optimal_hit_rate"] = optimum
            row["hit_rate_of_optimal"] = row["hit_rate"] / optimum if optimum else None
        if self.consts and "copy_bandwidth_GBps" in self.doc:
            f = wl.floors(
                self.consts,
                reqs,
                row["cached_prompt_tokens"],
                row["scheduler_steps"],
                self.doc["copy_bandwidth_GBps"],
                self.doc["matmul_TFLOPs"],
            )
            row.update(f, roofline_fraction=f["floor_s"] / row["wall_s"])
        self.doc["rows"].append(row)
        self.save()
        log(
            f"{workload} radix {radix}: {row['requests']} req in {row['wall_s']:.1f}s "
            f"({time.perf_counter() - t:.0f}s with warm-up): {row['req_s']:.2f} req/s, "
            f"{row['output_tok_s']:.1f} out tok/s, {row['input_tok_s']:.0f} in tok/s, TTFT p50/p99 "
            f"{row['ttft_ms_p50']:.0f}/{row['ttft_ms_p99']:.0f} ms, hit {row['hit_rate']:.4f}, "
            f"radix share {row['radix_share']:.2e}, complete {row['all_complete']}"
        )
        return row


def _log_dir(out: Path, name: str, tmp: Path) -> Path:
    return out / f"{name}_logs" if os.environ.get("STACK_KEEP_LOGS") else tmp / "logs"


def _ratio(on: dict[str, Any] | None, off: dict[str, Any] | None) -> dict[str, float]:
    if not on or not off:
        return {}
    return {
        "req_s": on["req_s"] / off["req_s"],
        "output_tok_s": on["output_tok_s"] / off["output_tok_s"]
        if off["output_tok_s"]
        else float("nan"),
        "wall": off["wall_s"] / on["wall_s"],
    }


def part_radix_ab(
    name: str, args: argparse.Namespace, reqs: list[wl.Req], spec: dict[str, Any]
) -> bool:
    """One workload with `--radix tree` and then `--radix off` (scheduler restarted)."""
    p = Part(name, args)
    p.doc["workload"] = spec
    optimum = wl.optimal_hit_rate([r.ids for r in reqs])
    p.doc["optimal_hit_rate"] = optimum
    rows: dict[str, dict[str, Any] | None] = {}
    with tempfile.TemporaryDirectory(prefix=f"radixmesh-{name}-") as td:
        stack = p.stack(_log_dir(args.out, name, Path(td)))
        try:
            for i, radix in enumerate(("tree", "off")):
                if i == 0:
                    stack.start(["--radix", radix])
                else:
                    stack.restart(["--radix", radix])
                rows[radix] = p.run(stack, name, reqs, radix, optimum)
        except Exception as exc:
            p.doc["errors"].append(f"stack: {exc!r}")
            p.doc["notes"] += stack.log_tails()
        finally:
            stack.stop()
    p.doc["speedup_radix_tree_vs_off"] = _ratio(rows.get("tree"), rows.get("off"))
    p.save()
    log(f"{name}: radix tree vs off {p.doc['speedup_radix_tree_vs_off']}")
    return not p.doc["errors"] and all(r and r["all_complete"] for r in rows.values())


def part_sharegpt(args: argparse.Namespace) -> bool:
    from radixmesh_bench.gpu.sample_sharegpt import load_sample

    sample = load_sample(args.sample)
    limit = args.requests or (QUICK_SHAREGPT if args.quick else None)
    reqs = wl.sharegpt_requests(sample, limit, QUICK_MAX_OUTPUT if args.quick else None)
    n_sub = min(args.hf_subset, len(reqs))
    subset = reqs[:n_sub]
    p = Part("sharegpt", args)
    p.doc["workload"] = {
        "sample": str(
            args.sample.relative_to(ROOT) if args.sample.is_relative_to(ROOT) else args.sample
        ),
        "source": sample["source"],
        "filter": sample["filter"],
        "seed": sample["seed"],
        "requests": len(reqs),
        "quick_output_cap": QUICK_MAX_OUTPUT if args.quick else None,
        "hf_subset": f"the first {n_sub} requests of the sample, in order, in static batches "
        f"of {args.hf_batch}; ours runs the same subset on a cold cache",
    }
    rows: dict[str, dict[str, Any] | None] = {}
    with tempfile.TemporaryDirectory(prefix="radixmesh-sharegpt-") as td:
        stack = p.stack(_log_dir(args.out, "sharegpt", Path(td)))
        try:
            stack.start(["--radix", "tree"])
            rows["all"] = p.run(stack, "sharegpt", reqs, "tree", None)
            stack.restart(["--radix", "tree"])
            rows["subset"] = p.run(stack, f"sharegpt-first{n_sub}", subset, "tree", None)
        except Exception as exc:
            p.doc["errors"].append(f"stack: {exc!r}")
            p.doc["notes"] += stack.log_tails()
        finally:
            stack.stop()
    with tempfile.TemporaryDirectory() as td:
        f = Path(td) / "reqs.json"
        f.write_text(json.dumps([[r.ids, r.max_new] for r in subset]))
        hf = _subprocess_json(
            [
                "--hf-worker",
                "--model",
                args.model,
                "--device",
                args.device,
                "--reqs-file",
                str(f),
                "--hf-batch",
                str(args.hf_batch),
            ],
            args.hf_timeout,
        )
    if "error" in hf:
        p.doc["errors"].append(hf["error"])
    else:
        sub = rows.get("subset")
        for r in hf.pop("rows"):
            r["workload"] = f"sharegpt-first{n_sub}"
            p.doc["rows"].append(r)
            if sub:
                p.doc["speedup_vs_hf_on_subset"] = sub["output_tok_s"] / r["output_tok_s"]
        p.doc["worker_hf"] = hf
    p.save()
    log(f"sharegpt: speedup vs HF on the subset {p.doc.get('speedup_vs_hf_on_subset')}")
    return not p.doc["errors"] and all(r and r["all_complete"] for r in rows.values())


def run_part(name: str, out: Path, argv: list[str] | None = None) -> bool:
    """Entry point for radixmesh_bench/gpu/run.py: the part with this module's defaults."""
    args = parser().parse_args(["--part", name, "--out", str(out), *(argv or [])])
    return _run(args)


def _run(args: argparse.Namespace) -> bool:
    t = time.perf_counter()
    if args.quick and args.hf_subset == HF_SUBSET:
        args.hf_subset = args.hf_batch = 4
    if args.part == "sharegpt":
        ok = part_sharegpt(args)
    elif args.part == "gsp":
        spec = wl.GSP_QUICK if args.quick else wl.GspSpec()
        ok = part_radix_ab("gsp", args, wl.gsp_requests(spec), vars(spec))
    else:
        mspec = wl.MMLU_QUICK if args.quick else wl.MmluSpec()
        ok = part_radix_ab("mmlu", args, wl.mmlu_requests(mspec), vars(mspec))
    log(f"part {args.part} done in {time.perf_counter() - t:.0f}s, ok={ok}")
    return ok


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--part", choices=PARTS)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny workloads (local CPU check)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/gpu")))
    ap.add_argument(
        "--max-running",
        type=int,
        default=256,
        help="scheduler --max-running; CUDA graphs are captured up to it",
    )
    ap.add_argument("--sample", type=Path, default=wl.default_sample_path())
    ap.add_argument(
        "--requests",
        type=int,
        default=0,
        help="sharegpt: the first N requests of the sample (default: all)",
    )
    ap.add_argument("--hf-subset", type=int, default=HF_SUBSET)
    ap.add_argument("--hf-batch", type=int, default=HF_SUBSET)
    ap.add_argument("--hf-timeout", type=float, default=300)
    ap.add_argument("--measure-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reqs-file", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.measure_worker or args.hf_worker:
        if args.measure_worker:
            res: dict[str, Any] = measure_worker()
        else:
            from radixmesh_bench.gpu.hf_serving import worker_hf_static

            reqs = [(list(p), int(o)) for p, o in json.loads(args.reqs_file.read_text())]
            res = worker_hf_static(args.model, args.device, reqs, args.hf_batch)
        args.json.write_text(json.dumps(res, default=str))
        return 0
    if not args.part:
        ap.error("--part is required")
    return 0 if _run(args) else 1


if __name__ == "__main__":
    sys.exit(main())
