"""GPU part `model_load`: the model service alone under load (tests/load/model_load.py).

The real model service (`--random-weights llama-3.1-8b --device cuda`, CUDA graphs up to batch
256) in its own process, driven over gRPC by the load test's fake scheduler at batch 1 to 256,
one and two steps in flight. Each (batch, depth) becomes one row of `model_load.json`:
decode tok/s, step time p50/p99 as the client sees it, the worker's forward time, and the idle
time per step that pipelining should remove.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from radixmesh_bench.gpu.common import log, new_doc
from radixmesh_bench.report import write_json

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama-3.1-8b"
ARGS = [
    "--random-weights",
    MODEL,
    "--device",
    "cuda",
    "--batches",
    "1,8,32,64,128,256",
    "--inflight",
    "1,2",
    "--prompt-len",
    "128",
    "--warmup",
    "8",
    "--steps",
    "64",
    "--cuda-graph-max-bs",
    "256",
]
TIMEOUT_S = 360  # below the device_run.sh limit suggested in docs/gpu.md (400)


def part_model_load(out: Path) -> bool:
    doc = new_doc("model_load")
    doc["workload"] = {"args": ARGS}
    with tempfile.TemporaryDirectory() as td:
        path = Path(td) / "model_load.json"
        cmd = [
            sys.executable,
            str(ROOT / "tests" / "load" / "model_load.py"),
            *ARGS,
            "--out",
            str(path),
        ]
        log(f"model_load: {' '.join(cmd[1:])}")
        t = time.perf_counter()
        rc: int | str
        try:
            rc = subprocess.run(
                cmd, cwd=ROOT, timeout=TIMEOUT_S, stdout=subprocess.DEVNULL
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        doc["wall_s"] = time.perf_counter() - t
        if rc != 0 or not path.exists():
            doc["errors"].append(f"model_load exited with {rc} after {doc['wall_s']:.0f}s")
            write_json(doc, out / "model_load.json")
            return False
        report = json.loads(path.read_text())
    cases = report.pop("cases")
    doc["report"] = report
    for c in cases:
        doc["rows"].append(
            {
                "system": "radixmesh",
                "variant": f"model service alone, {c['inflight']} in flight",
                "path": "grpc-model-service",
                "model": f"{MODEL} random {report['dtype']}",
                "batch": c["batch"],
                "input_len": report["prompt_len"],
                "output_len": c["steps"],
                "tok_s": c["decode_tok_s"],
                "decode_step_ms_median": c["step_ms_p50"],
                **{k: v for k, v in c.items() if k not in ("batch", "steps", "decode_tok_s")},
            }
        )
    write_json(doc, out / "model_load.json")
    bad = [c for c in cases if c.get("tokens_match") is False]
    if bad:
        doc["errors"].append(f"pipelined tokens differ at batch {[c['batch'] for c in bad]}")
        write_json(doc, out / "model_load.json")
    return not bad
