"""How long a long prompt stalls a short request (issue 12 item 14), on a real CPU stack.

Starts the default stack (SmolLM2-135M on CPU, every service a process), then:

- idle: a 16-token request alone (greedy, ignore_eos), after one warm-up;
- contended: a 3,000-token prompt (random ids, 16 new tokens) and, 0.2 s after it was sent, the
  same kind of 16-token request; reports the short request's latency, its time to first token
  and its largest gap between tokens, and the long request's time to first token.

Each run uses fresh random prompts (no prefix-cache hits). Scheduler flags go through
`--scheduler-args`, so the same script measures any chunking setting; run it with another
checkout first on PYTHONPATH to measure that code ("before").

    python tests/load/prefill_stall.py --label after --out results/prefill_stall_after.json

JSON on stdout (and `--out FILE`).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from radixmesh.api import Client, GenerateResult

from tests.conftest import start_stack

SHORT_PROMPT = "List the days of the week:"


def _timed_stream(c: Client, **kw: Any) -> dict[str, float]:
    t0 = time.perf_counter()
    stamps: list[float] = []
    for item in c.stream(**kw):
        if not isinstance(item, GenerateResult):
            stamps.append(time.perf_counter() - t0)
    end = time.perf_counter() - t0
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return {
        "latency_s": round(end, 3),
        "ttft_s": round(stamps[0], 3) if stamps else end,
        "max_gap_s": round(max(gaps), 3) if gaps else 0.0,
        "chunks": len(stamps),
    }


def measure(endpoint: str, long_tokens: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    short = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}
    with Client(endpoint, timeout=600) as c:
        _timed_stream(c, prompt=f"{rng.random()} {SHORT_PROMPT}", **short)  # warm-up
        idle = _timed_stream(c, prompt=f"{rng.random()} {SHORT_PROMPT}", **short)
        long_ids = [rng.randrange(100, 40000) for _ in range(long_tokens)]
        long_out: dict[str, dict[str, float]] = {}

        def run_long() -> None:
            long_out["r"] = _timed_stream(c, input_ids=long_ids, **short)

        t = threading.Thread(target=run_long)
        t.start()
        time.sleep(0.2)  # workload timing (the short request arrives just after), not a sync
        contended = _timed_stream(c, prompt=f"{rng.random()} {SHORT_PROMPT}", **short)
        t.join()
    return {
        "idle_short": idle,
        "contended_short": contended,
        "long": long_out["r"],
        "slowdown": round(contended["latency_s"] / idle["latency_s"], 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--label", default="run")
    p.add_argument("--long-tokens", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--scheduler-args", default="", help="extra scheduler flags, one string")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    sched_args = shlex.split(a.scheduler_args)
    tmp = Path(tempfile.mkdtemp(prefix="stall-"))
    with contextmanager(start_stack)(tmp, ["--kv-tokens", "16384"], sched_args) as stack:
        runs = [measure(stack.endpoint, a.long_tokens, seed) for seed in range(a.repeats)]
    report = {
        "label": a.label,
        "scheduler_args": sched_args,
        "long_tokens": a.long_tokens,
        "runs": runs,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
