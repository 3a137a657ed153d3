"""py-spy's raw (folded) profiles as top-frame tables (JSON).

`py-spy record --format raw` writes one line per distinct stack, `frame;frame;... count`, each
frame `function (file:line)`. A frame's lines are merged (`function (file)`), then counted two
ways: "self" (the sample's innermost frame: where the time went) and "total" (every frame on the
stack, once per sample: what the time was spent under).

    python -m radixmesh_bench.pyspy_summary RAW... [--top 15] [--cpu NAME=CORES ...]

Used by the scheduler load test and by the GPU serving script (`device_sglang_bench.sh`, with
BENCH_PROFILE), which records every process of a running stack at once.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

_LINE_NO = re.compile(r":\d+\)$")


def summarize_raw(text: str, top: int = 15) -> dict[str, Any]:
    """{samples, self: [{function, pct, total_pct}], total: [{function, pct}]} of one raw
    profile (a self entry also says the share of samples its function was on the stack)."""
    self_t: Counter[str] = Counter()
    total_t: Counter[str] = Counter()
    samples = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        samples += c
        frames = [_LINE_NO.sub(")", f) for f in stack.split(";")]
        self_t[frames[-1]] += c
        for f in set(frames):
            total_t[f] += c

    def pct(c: int) -> float:
        return round(100 * c / samples, 1)

    return {
        "samples": samples,
        "self": [
            {"function": f, "pct": pct(c), "total_pct": pct(total_t[f])}
            for f, c in self_t.most_common(top)
        ],
        "total": [{"function": f, "pct": pct(c)} for f, c in total_t.most_common(top)],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw", nargs="+", type=Path, help="py-spy raw files")
    p.add_argument("--top", type=int, default=15)
    p.add_argument(
        "--cpu", action="append", default=[], help="NAME=CORES: cores busy over the window"
    )
    ns = p.parse_args()
    cores = dict(kv.split("=", 1) for kv in ns.cpu)
    out = {}
    for f in ns.raw:
        entry = summarize_raw(f.read_text(errors="replace"), ns.top)
        if f.stem in cores:
            entry["cores_busy"] = float(cores[f.stem])
        out[f.stem] = entry
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
