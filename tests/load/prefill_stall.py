"""How long a long prompt stalls a short request (issue 12 item 14), on a real CPU stack.

Starts the default stack (SmolLM2-135M on CPU, every service a process), then:

- idle: a 16-token request alone (greedy, ignore_eos), after one warm-up;
- contended: a 3,000-token prompt (random ids, 16 new tokens) and, 0.2 s after it was sent, the
  same kind of 16-token request; reports the short request's latency, its time to first token
  and its largest gap between tokens, and the long request's time to first token;
- the short request's wait in scheduler steps: the scheduler's step counter (GetStats) read
  just before it is sent and again when it ends, so `short_steps` is the number of steps the
  scheduler ran while the short request was live (its own work is 1 prefill + 15 decodes);
- `--prompt-logprobs`: the long and the short requests ask for prompt logprobs (from 0);
- `--chat`: short requests are chat messages (the model's template makes them ~40 tokens);
- `--shorts K`: K short requests sent together (the slowest is reported, steps until all end);
- `--background N`: N requests decode throughout (each step then has a decode, so the
  smaller decoding chunk budget applies), aborted at the end.

The issue-26 scenario: `--chat --background 1`, with and without `--prompt-logprobs --shorts 4`.

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


def _short_kw(rng: random.Random, chat: bool) -> dict[str, Any]:
    text = f"{rng.random()} {SHORT_PROMPT}"
    return {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}


def measure(endpoint: str, long_tokens: int, seed: int, a: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(seed)
    short: dict[str, Any] = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}
    if a.prompt_logprobs:
        short["prompt_logprobs_from"] = 0
    with Client(endpoint, timeout=600) as c:
        _timed_stream(c, **_short_kw(rng, a.chat), **short)  # warm-up
        idle = _timed_stream(c, **_short_kw(rng, a.chat), **short)
        long_ids = [rng.randrange(100, 40000) for _ in range(long_tokens)]
        out: dict[str, dict[str, float]] = {}

        def run(name: str, **kw: Any) -> None:
            out[name] = _timed_stream(c, **kw)

        # Background decoders: running before the long prompt and until every short request
        # ended (then aborted), so each step of the measurement has a decode in it.
        bg_ids = [f"bg-{seed}-{i}" for i in range(a.background)]
        bgs = [
            threading.Thread(
                target=run,
                args=(rid,),
                kwargs={
                    "prompt": f"{rng.random()} Count to a thousand:",
                    "request_id": rid,
                    "max_new_tokens": 4000,
                    "ignore_eos": True,
                    "temperature": 0.0,
                },
            )
            for rid in bg_ids
        ]
        for t in bgs:
            t.start()
        time.sleep(1.0 if bgs else 0)  # workload timing (they decode by then), not a sync
        long_t = threading.Thread(
            target=run, args=("long",), kwargs={"input_ids": long_ids, **short}
        )
        long_t.start()
        time.sleep(0.2)  # workload timing (the short requests arrive just after), not a sync
        steps0 = c.stats().steps
        shorts = [
            threading.Thread(
                target=run, args=(f"short{i}",), kwargs={**_short_kw(rng, a.chat), **short}
            )
            for i in range(a.shorts)
        ]
        for t in shorts:
            t.start()
        for t in shorts:
            t.join()
        short_steps = c.stats().steps - steps0
        for rid in bg_ids:
            c.abort(rid)
        for t in [long_t, *bgs]:
            t.join()
    contended = [out[f"short{i}"] for i in range(a.shorts)]
    worst = max(contended, key=lambda r: r["latency_s"])
    return {
        "idle_short": idle,
        "contended_short": {**worst, "short_steps": short_steps},
        "contended_all": [r["latency_s"] for r in contended],
        "long": out["long"],
        "slowdown": round(worst["latency_s"] / idle["latency_s"], 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--label", default="run")
    p.add_argument("--long-tokens", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--scheduler-args", default="", help="extra scheduler flags, one string")
    p.add_argument("--prompt-logprobs", action="store_true", help="both requests ask for them")
    p.add_argument("--chat", action="store_true", help="short requests as chat (templated)")
    p.add_argument("--shorts", type=int, default=1, help="short requests sent together")
    p.add_argument("--background", type=int, default=0, help="requests decoding meanwhile")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    sched_args = shlex.split(a.scheduler_args)
    tmp = Path(tempfile.mkdtemp(prefix="stall-"))
    with contextmanager(start_stack)(tmp, ["--kv-tokens", "16384"], sched_args) as stack:
        runs = [measure(stack.endpoint, a.long_tokens, seed, a) for seed in range(a.repeats)]
    report = {
        "label": a.label,
        "prompt_logprobs": a.prompt_logprobs,
        "chat": a.chat,
        "shorts": a.shorts,
        "background": a.background,
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
