"""One `bench_serving` result from several clients run at once against one address
(`device_sglang_bench.sh` with BENCH_CLIENTS=N): a single client process reads every stream's
events itself and falls behind at ~10k tokens/s (the 4-replica run's median ITL of 0.04 ms:
events read in bursts), so a scaling run splits the prompts over N clients.

    python -m radixmesh_bench.gpu.merge_clients CLIENT.jsonl... > merged line (JSON)

Each file's last line is one client's result. Merged: counts and tokens summed; the duration
is the longest client's (they start together and overlap), so `output_throughput` is all
output tokens over it (a lower bound: each client's own start-up is inside its duration); the
latency percentiles cannot be merged exactly, so the merged line gives each client's median and
p99 TTFT / ITL and their means.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import fmean
from typing import Any

SUMMED = ("completed", "total_input_tokens", "total_output_tokens")
PER_CLIENT = ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "mean_tpot_ms")


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    if not results:
        raise ValueError("no client results to merge")
    names = {r.get("dataset_name") for r in results}
    if len(names) != 1:
        raise ValueError(f"client results of different workloads: {sorted(map(str, names))}")
    duration = max(float(r["duration"]) for r in results)
    out: dict[str, Any] = {
        "dataset_name": results[0].get("dataset_name"),
        "clients": len(results),
        "duration": duration,
    }
    for k in SUMMED:
        out[k] = sum(int(r.get(k, 0)) for r in results)
    out["output_throughput"] = out["total_output_tokens"] / duration
    out["request_throughput"] = out["completed"] / duration
    out["sum_of_client_output_throughputs"] = sum(float(r["output_throughput"]) for r in results)
    for k in PER_CLIENT:
        values = [float(r[k]) for r in results if r.get(k) is not None]
        out[f"{k}_per_client"] = values
        out[f"{k}_mean_of_clients"] = fmean(values) if values else None
    return out


def last_line(path: Path) -> dict[str, Any]:
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"{path}: no result line")
    return dict(json.loads(lines[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    ns = p.parse_args()
    m = merge([last_line(f) for f in ns.files])
    print(json.dumps(m))
    print(  # the progress line the serving script shows, as bench_serving's own
        f"{m['clients']} clients, {m['dataset_name']}: {m['completed']} requests, output "
        f"{m['output_throughput']:.1f} tok/s, median ITL per client "
        f"{m['median_itl_ms_per_client']}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
