"""Part `constrained`: JSON-schema constrained decoding through the whole stack on the GPU.

The four services as separate processes (`services.launcher`): model service with
`--random-weights llama-3.1-8b` (flashinfer, CUDA graphs), tokenizer and grammar services on the
random model's folder, so xgrammar compiles against the real Llama-3.1 tokenizer (128,256-wide
masks). Prompts are random token ids sent as `input_ids` (exact lengths, no shared prefixes:
every run draws new ones, so no run hits another's cache). Greedy.

For each jump-forward setting (the scheduler restarted with `--jump-forward off`, then `on`;
the model keeps its weights) and each batch (1 request at a time x4, 16 at once, 64 at once):

1. constrained: request i uses schema i mod 4 (radixmesh_bench/gpu/constrained_schemas.py: long
fixed
   keys, bounded strings, enums, bounded integers), EOS honoured, `max_new_tokens` 256 as a cap;
2. unconstrained, length-matched: the same number of requests, each with `max_new_tokens` =
   its constrained twin's output length and `ignore_eos`, so both runs write the same tokens
   with the same batch shape; the grammar's cost is the difference.

Each run reports output tok/s, TTFT and ITL p50/p99 (client side, chunk arrival times; a chunk
of n tokens counts as n gaps of 1/n, as in part `stack`), scheduler steps, forward passes per
request (the tokens the scheduler sampled for it: its prefill, decodes and jump-forward
extends; jumped tokens cost none), mask stall (GetStats `mask_wait_seconds` over the run's
steps, and as a fraction of the run's wall time, i.e. of the mean step), and `jump_forwards` /
`jump_forward_tokens`. Rounds (3) run constrained and twin back to back; the round with the
median ratio is reported, every round's ratio is kept. Constrained outputs that stopped are
validated (jsonschema, or the subset validator where the GPU machine lacks it); outputs cut by
the cap are counted. Goal (issue 5): ratio >= 0.90 at batch 64 with jump-forward off, > 1.0 on.

Local check of the orchestration on CPU (tiny random Llama, Llama-3.1 tokenizer, batches
1/4/8, one round; about a minute):

    python radixmesh_bench/gpu/constrained_gpu.py --model tiny-llama --device cpu --quick --out
    /tmp/cg
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from radixmesh_bench.gpu.common import log, log_tails, new_doc  # noqa: E402
from radixmesh_bench.gpu.constrained_report import (  # noqa: E402
    GOALS,
    MODES,
    STAT_FIELDS,
    Outcome,
    finish_doc,
    summarize,
    validity,
)
from radixmesh_bench.gpu.constrained_schemas import SCHEMA_TEXT, SCHEMAS, VALIDATOR_NAME  # noqa: E402
from radixmesh_bench.report import write_json  # noqa: E402


@dataclass(frozen=True)
class Batch:
    name: str
    concurrency: int  # requests in flight at once
    requests: int


BATCHES = (Batch("batch1", 1, 4), Batch("batch16", 16, 16), Batch("batch64", 64, 64))
QUICK_BATCHES = (Batch("batch1", 1, 1), Batch("batch4", 4, 4), Batch("batch8", 8, 8))
MAX_NEW_TOKENS = 256  # a cap: the schemas end within ~100 tokens; what it cuts is counted
CHUNK_TOKENS = 8192  # 64 x 128-token prompts prefill in one step
VOCAB_TEXT = 128000  # ordinary Llama-3.1 ids (specials start at 128000)
SEED_BASE = 5000


async def stream_one(client: Any, schema: str, kw: dict[str, Any]) -> Outcome:
    from radixmesh.api import Chunk, GenerateResult, RadixMeshError

    t0 = time.perf_counter()
    arrivals: list[tuple[float, int]] = []
    out = Outcome(schema)
    try:
        async for item in client.stream(**kw):
            if isinstance(item, Chunk):
                arrivals.append((time.perf_counter(), len(item.token_ids)))
            elif isinstance(item, GenerateResult):
                out.text, out.finish = item.text, item.finish_reason
                out.tokens = item.completion_tokens
    except RadixMeshError as exc:
        out.error = f"{exc.code.name}: {exc.message}"[:300]
        return out
    itl: list[float] = []
    for (ta, _), (tb, n) in zip(arrivals, arrivals[1:], strict=False):
        itl += [(tb - ta) / max(n, 1)] * max(n, 1)
    out.ttft_s = (arrivals[0][0] - t0) if arrivals else time.perf_counter() - t0
    out.itl_s = tuple(itl)
    return out


async def run_batch(
    endpoint: str, reqs: Sequence[tuple[str, dict[str, Any]]], concurrency: int, timeout: float
) -> tuple[dict[str, Any], list[Outcome]]:
    """`reqs` (schema name, Generate kwargs), `concurrency` in flight; stats deltas around it."""
    from radixmesh.api import AsyncClient

    async with AsyncClient(endpoint, timeout=timeout) as c:
        s0 = await c.stats()
        gate = asyncio.Semaphore(concurrency)

        async def one(schema: str, kw: dict[str, Any]) -> Outcome:
            async with gate:
                return await stream_one(c, schema, kw)

        t0 = time.perf_counter()
        outs = list(await asyncio.gather(*(one(s, kw) for s, kw in reqs)))
        wall = time.perf_counter() - t0
        s1 = await c.stats()
    delta = {f: getattr(s1, f) - getattr(s0, f) for f in STAT_FIELDS}
    return summarize(outs, wall, delta), outs


# -- requests ------------------------------------------------------------------------------


class Prompts:
    """Fresh random prompts for every run (distinct seeds), so no run hits another's cache."""

    def __init__(self, input_len: int) -> None:
        self.input_len = input_len
        self.seed = SEED_BASE

    def take(self, n: int) -> list[list[int]]:
        from radixmesh_bench.gpu.perf import prompts

        self.seed += 1
        return prompts(n, self.input_len, VOCAB_TEXT, self.seed)


def constrained_reqs(ps: list[list[int]], max_new: int) -> list[tuple[str, dict[str, Any]]]:
    names = list(SCHEMAS)
    out = []
    for i, ids in enumerate(ps):
        name = names[i % len(names)]
        kw = {"input_ids": ids, "max_new_tokens": max_new, "temperature": 0.0}
        out.append((name, kw | {"json_schema": SCHEMA_TEXT[name]}))
    return out


def twin_reqs(ps: list[list[int]], lengths: Sequence[int]) -> list[tuple[str, dict[str, Any]]]:
    """Unconstrained, each exactly as long as its constrained twin's output."""
    return [
        ("", {"input_ids": ids, "max_new_tokens": max(1, n), "ignore_eos": True, "temperature": 0})
        for ids, n in zip(ps, lengths, strict=True)
    ]


def twin_lengths(outs: Sequence[Outcome]) -> list[int]:
    done = [o.tokens for o in outs if not o.error]
    fill = round(statistics.mean(done)) if done else 1
    return [o.tokens if not o.error else fill for o in outs]


# -- measuring -----------------------------------------------------------------------------


def measure_batch(
    endpoint: str, b: Batch, rounds: int, pr: Prompts, timeout: float
) -> dict[str, Any]:
    """`rounds` x (constrained run, its length-matched unconstrained twin); the round with the
    median ratio is reported, every round is kept."""
    runs: list[dict[str, Any]] = []
    valid = {"checked": 0, "valid_strict": 0, "valid_lenient": 0, "invalid": 0}
    examples: list[dict[str, str]] = []
    for _ in range(rounds):
        c, c_outs = asyncio.run(
            run_batch(
                endpoint,
                constrained_reqs(pr.take(b.requests), MAX_NEW_TOKENS),
                b.concurrency,
                timeout,
            )
        )
        v = validity(c_outs)
        for k in valid:
            valid[k] += v[k]
        examples += v["examples_not_strict"][: 4 - len(examples)]
        u, _ = asyncio.run(
            run_batch(
                endpoint,
                twin_reqs(pr.take(b.requests), twin_lengths(c_outs)),
                b.concurrency,
                timeout,
            )
        )
        ratio = round(c["tok_s"] / u["tok_s"], 4) if u["tok_s"] else None
        samples = [o.text for o in c_outs[:2]]  # to read: what random weights wrote
        runs.append(
            {
                "constrained": c,
                "unconstrained_length_matched": u,
                "ratio": ratio,
                "samples": samples,
            }
        )
    ordered = sorted(runs, key=lambda r: r["ratio"] or 0.0)
    median = ordered[len(ordered) // 2]
    return {
        "batch": b.concurrency,
        "requests": b.requests,
        "constrained": median["constrained"],
        "unconstrained_length_matched": median["unconstrained_length_matched"],
        "ratio_constrained_over_unconstrained": median["ratio"],
        "ratio_rounds": [r["ratio"] for r in runs],
        "validity": valid | {"examples_not_strict": examples},
        "sample_outputs": median["samples"],
        "rounds": runs,
    }


def warm_up(endpoint: str, pr: Prompts, top: int, timeout: float) -> None:
    """Compile every schema (first use only: the grammar service outlives scheduler restarts)
    and run the largest batch once, short, constrained and not."""
    from radixmesh.api import Client

    from radixmesh_bench.constrained_requests import wait_constrained

    with Client(endpoint, timeout=timeout) as c:
        wait_constrained(c, timeout=timeout)
    asyncio.run(run_batch(endpoint, constrained_reqs(pr.take(len(SCHEMAS)), 4), 1, timeout))
    asyncio.run(run_batch(endpoint, constrained_reqs(pr.take(top), 16), top, timeout))
    asyncio.run(run_batch(endpoint, twin_reqs(pr.take(top), [16] * top), top, timeout))


def start_stack(
    model: str, device: str, sched_args: list[str], log_dir: Path, running: ExitStack
) -> Any:
    """The stack (radixmesh_bench.stack: the benches' one starter), held by `running`."""
    from radixmesh_bench.constrained_requests import BenchStack
    from radixmesh_bench.stack import launcher_for, random_model_args
    from radixmesh_bench.stack import running as started
    from services.launcher import StackPorts, stack_specs

    model_dir, model_args = random_model_args(model, device, 128)
    ports = StackPorts.free()
    specs = stack_specs(ports, str(model_dir), model_args=model_args, scheduler_args=sched_args)
    launcher = launcher_for(specs, log_dir, env={"PYTHONUNBUFFERED": "1"})
    running.enter_context(started(launcher, timeout=300))
    return BenchStack(launcher, ports, log_dir)


def part_constrained(
    out: Path,
    model: str = "llama-3.1-8b",
    device: str = "cuda",
    quick: bool = False,
    rounds: int = 0,
    timeout: float = 0.0,
) -> bool:
    batches = QUICK_BATCHES if quick else BATCHES
    rounds = rounds or (1 if quick else 3)
    timeout = timeout or (300.0 if device == "cpu" else 120.0)
    top = max(b.requests for b in batches)
    sched = ["--chunk-tokens", str(CHUNK_TOKENS), "--max-running", str(max(64, top))]
    pr = Prompts(32 if quick else 128)
    doc = new_doc("constrained")
    doc.update(
        model=f"{model} random",
        input_len=pr.input_len,
        max_new_tokens=MAX_NEW_TOKENS,
        batches=[vars(b) for b in batches],
        rounds=rounds,
        scheduler_args=sched,
        schemas=SCHEMAS,
        validator=VALIDATOR_NAME,
        goals=GOALS,
        modes={},
    )
    keep = os.environ.get("STACK_KEEP_LOGS")
    log_dir = out / "constrained_logs" if keep else Path(tempfile.mkdtemp(prefix="radixmesh-cg-"))
    t = time.perf_counter()
    running = ExitStack()
    try:
        st = start_stack(model, device, [*sched, "--jump-forward", MODES[0]], log_dir, running)
    except Exception as exc:
        doc["errors"].append(f"stack start: {exc!r}")
        doc["notes"] += log_tails(log_dir)
        write_json(doc, out / "constrained.json")
        return False
    doc["stack_ready_s"] = round(time.perf_counter() - t, 1)
    log(f"stack ready in {doc['stack_ready_s']}s (logs in {log_dir})")
    try:
        for i, mode in enumerate(MODES):
            t = time.perf_counter()
            if i:
                st.restart_scheduler([*sched, "--jump-forward", mode])
            warm_up(st.endpoint, pr, top, timeout)
            log(f"jump-forward {mode}: scheduler up and warm in {time.perf_counter() - t:.1f}s")
            res: dict[str, Any] = {}
            for b in batches:
                res[b.name] = measure_batch(st.endpoint, b, rounds, pr, timeout)
                _log_batch(mode, b.name, res[b.name])
            doc["modes"][mode] = res
            write_json(doc, out / "constrained.json")  # keep partial results
    except Exception as exc:
        import traceback

        traceback.print_exc()
        doc["errors"].append(f"{type(exc).__name__}: {exc}")
        doc["notes"] += log_tails(log_dir)
    finally:
        running.close()
    finish_doc(doc, batches[-1].name)
    write_json(doc, out / "constrained.json")
    return not doc["errors"]


def _log_batch(mode: str, name: str, r: dict[str, Any]) -> None:
    c, u, v = r["constrained"], r["unconstrained_length_matched"], r["validity"]
    log(
        f"jf {mode} {name}: constrained {c['tok_s']:.1f} tok/s vs unconstrained "
        f"{u['tok_s']:.1f} -> {r['ratio_constrained_over_unconstrained']} "
        f"(rounds {r['ratio_rounds']}); passes/request {c['forward_passes_per_request']} vs "
        f"{u['forward_passes_per_request']}; mask stall {c['mask_stall_ms_per_step']} ms/step "
        f"({c['mask_stall_fraction_of_step']}); cut {c['cut_by_length']}; valid "
        f"{v['valid_strict']}+{v['valid_lenient']} lenient of {v['checked']}, "
        f"invalid {v['invalid']}; errors {c['errors']}+{u['errors']}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="batches 1/4/8, one round")
    ap.add_argument("--rounds", type=int, default=0, help="rounds per batch (default 3; quick 1)")
    ap.add_argument("--timeout", type=float, default=0.0, help="per-request deadline (s)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/gpu")))
    args = ap.parse_args(argv)
    from services.logging import configure_logging

    configure_logging("bench", "warning")  # the launcher's events stay off stdout
    ok = part_constrained(args.out, args.model, args.device, args.quick, args.rounds, args.timeout)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
