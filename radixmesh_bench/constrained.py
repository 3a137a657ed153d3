"""`radixmesh bench constrained`: what constrained decoding costs on the CPU stack.

(a) Compile cost. The stack's grammar service runs with `--disable-xgrammar-cache`, so the
    first Compile of each suite grammar (straight to the grammar service's port through the
    radixmesh_wire/pb grammar stubs, before any request) is a real compile; a second pass shows the
    cached cost. Both are set against the typical request time. Then the effect of reuse on
    throughput: N concurrent requests with one schema (compiled once) vs N with distinct but
    equivalent schemas (a per-request "description", so every cache key differs and each
    request pays a compile); the SGLang paper saw 2.4x lower throughput without reuse.
(b) Constrained vs unconstrained throughput at batch 1 and 16: the suite's chat prompts, same
    max tokens, greedy, EOS honoured (ignore_eos off), with and without the grammar. Also the
    stack's CPU seconds per service (steadier than wall time on a shared machine).
    Mask stall: the scheduler keeps `mask_wait_seconds` but GetStats does not expose it, so it
    is measured from outside: the batch-16 constrained outputs are replayed through a Masks
    session of our own on the same grammar service, one MaskStep per decode step (accept the
    last token, want every active row's mask), timing each round trip; the scheduler awaits
    exactly such a step before it sends each model step.
(c) Jump-forward ablation (`--jump-forward-ablation`, on by default): the scheduler restarted
    with `--jump-forward off` and `on` on the constrained batch-16 workload. Skipped, with a
    note, when the scheduler rejects the flag.

JSON on stdout, progress on stderr:

    radixmesh bench constrained [--quick] [--jump-forward on|off] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from radixmesh.api import Client, GenerateResult, RadixMeshError

from grammar_service.suite import SUITE, GrammarCase
from radixmesh_bench.stack import launcher_for, pct, progress, restart_scheduler, running
from services.launcher import Launcher, StackPorts, stack_specs

# One chat prompt per suite grammar, asking for what the grammar allows, and the output budget
# that lets the greedy and the seeded runs finish (integration test: < 10 % cut by length).
PROMPTS: dict[str, tuple[str, int]] = {
    "person": (
        "Give me a JSON object for a person named Ada who is 36 years old, with the keys "
        "name and age.",
        48,
    ),
    "nested_address": (
        "Return JSON for a customer named Bo who lives at 1 Rue X, Paris, zip "
        "75001: keys name and address (street, city, zip).",
        64,
    ),
    "int_array": ("Give a JSON array of three small integers.", 48),
    "status_enum": ("Is the account active, inactive or banned? Answer with a JSON string.", 48),
    "bounded_numbers": (
        "Report today's weather as JSON with temperature in Celsius, humidity "
        "in percent and pressure in hPa.",
        64,
    ),
    "pattern_fields": ("Return JSON with a phone number and a product code like ABC-12.", 64),
    "optional_fields": ("Return a JSON user record with id 7, nick ada and admin false.", 48),
    "bool_null": ("Return JSON where flag is true and nothing is null.", 48),
    "deep_nesting": ("Return JSON where a.b.c.d is 3.", 48),
    "object_array": (
        "List two items as a JSON array of objects with an id and a tag (red, green or blue).",
        64,
    ),
    "any_of": ("Reply with a short JSON value: one word or a number.", 48),
    "const_version": ("Return JSON with version 1.0 and ok true.", 48),
    "tool_call": (
        "Call a tool to search the web for sglang with limit 5. Reply with JSON: "
        "name and arguments.",
        64,
    ),
    "character": (
        "Describe Hermione Granger as JSON: name, house, blood_status, wand (wood, "
        "core, length) and alive.",
        96,
    ),
    "defs_ref": (
        "Return JSON with two points, from and to, each with x and y between -9 and 9.",
        64,
    ),
    "free_text": ("Give a short title and two tags for a blog post about cooking, as JSON.", 96),
    "paper_summary_grade": (
        "Summarize the essay 'My summer holiday' in one sentence and grade "
        "it A, B, C or D. Reply in JSON with summary and grade.",
        96,
    ),
    "ipv4": ("What is the IP address of a typical home router?", 48),
    "iso_date": ("What is the date of the first moon landing? Answer as YYYY-MM-DD.", 48),
    "choice": ("Is the sky blue? Answer yes, no or maybe.", 48),
    "email": ("Write an example email address.", 48),
    "us_phone": ("Write an example US phone number.", 48),
    "ebnf_digits": ("List up to four digits in parentheses, separated by commas.", 48),
    "ebnf_answer": ("Is water wet? Answer yes, no or unsure.", 48),
}


def constrained_request(
    case: GrammarCase,
    *,
    temperature: float = 0.0,
    seed: int | None = None,
    max_new_tokens: int | None = None,
    constrained: bool = True,
) -> dict[str, Any]:
    """Client.generate keyword arguments for one suite case (chat prompt, its grammar)."""
    prompt, budget = PROMPTS[case.name]
    kw: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "max_new_tokens": max_new_tokens or budget,
        "temperature": temperature,
    }
    if seed is not None:
        kw["seed"] = seed
    if constrained:
        kw[case.kind.value] = case.text
    return kw


assert set(PROMPTS) == {c.name for c in SUITE}, "every suite grammar needs a prompt"


# --- the stack ----------------------------------------------------------------------------


@dataclass
class BenchStack:
    launcher: Launcher
    ports: StackPorts
    logs: Path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.ports.tokenizer}"

    @property
    def grammar_address(self) -> str:
        return f"127.0.0.1:{self.ports.grammar}"

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds (user + system) each service process has used so far."""
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for name, proc in self.launcher.procs.items():
            try:
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                out[name] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
            except (OSError, IndexError):
                out[name] = float("nan")
        return out

    def restart_scheduler(self, extra_args: Sequence[str]) -> None:
        """Same peers, new scheduler flags (the model keeps its weights loaded)."""
        spec = self.launcher.specs["scheduler"]
        peers = [a for a in spec.args if a.startswith(("--model-address", "--grammar-address"))]
        restart_scheduler(self.launcher, [*peers, *extra_args], timeout=300, stop_wait_s=60)


@contextlib.contextmanager
def bench_stack(
    model: str, scheduler_args: Sequence[str], grammar_args: Sequence[str]
) -> Iterator[BenchStack]:
    ports = StackPorts.free()
    logs = Path(tempfile.mkdtemp(prefix="radixmesh-bench-constrained-"))
    specs = stack_specs(
        ports, model, scheduler_args=list(scheduler_args), grammar_args=list(grammar_args)
    )
    progress(
        f"starting stack (logs in {logs}); scheduler {' '.join(scheduler_args) or '-'}; "
        f"grammar {' '.join(grammar_args)}"
    )
    with running(launcher_for(specs, logs), timeout=600) as launcher:
        yield BenchStack(launcher, ports, logs)


def scheduler_accepts(args: Sequence[str]) -> tuple[bool, str]:
    """Whether the scheduler's own flag parser takes `args` (and its message if not)."""
    code = (
        "import sys\nfrom scheduler_service.config import SchedulerConfig\n"
        "from services.config import parse_config\n"
        "parse_config(SchedulerConfig, sys.argv[1:])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    lines = proc.stderr.strip().splitlines()
    return proc.returncode == 0, lines[-1] if lines else ""


def wait_constrained(c: Client, timeout: float = 120.0) -> float:
    """Seconds until a constrained request goes through: the stack's readiness does not cover
    the scheduler's grammar link (nor a just-restarted scheduler's front-door link)."""
    t0 = time.monotonic()
    while True:
        try:
            c.generate("Answer:", regex="(yes|no)", max_new_tokens=2, temperature=0)
            return time.monotonic() - t0
        except RadixMeshError as exc:
            if exc.code.name != "UNAVAILABLE" or time.monotonic() - t0 > timeout:
                raise
            time.sleep(0.2)


# --- requests -----------------------------------------------------------------------------


@dataclass
class Outcome:
    result: GenerateResult | None
    latency_s: float
    ttft_s: float
    error: str = ""


def one(c: Client, kw: dict[str, Any]) -> Outcome:
    t0 = time.perf_counter()
    first = None
    final = None
    try:
        for item in c.stream(**kw):
            if first is None:
                first = time.perf_counter() - t0
            if isinstance(item, GenerateResult):
                final = item
    except RadixMeshError as exc:
        return Outcome(
            None, time.perf_counter() - t0, first or 0.0, f"{exc.code.name}: {exc.message}"[:300]
        )
    return Outcome(final, time.perf_counter() - t0, first or 0.0)


def run_batch(
    st: BenchStack, reqs: Sequence[dict[str, Any]], concurrency: int, timeout: float
) -> tuple[dict[str, Any], list[Outcome]]:
    """Run `reqs` `concurrency` at a time; a summary and the outcomes (errors are counted,
    never raised: a hung or failed request is data)."""
    with Client(st.endpoint, timeout=timeout) as c:
        s0, cpu0 = c.stats(), st.cpu_s()
        t0 = time.perf_counter()
        if concurrency == 1:
            outs = [one(c, kw) for kw in reqs]
        else:
            with ThreadPoolExecutor(concurrency) as pool:
                outs = list(pool.map(lambda kw: one(c, kw), reqs))
        wall = time.perf_counter() - t0
        s1, cpu1 = c.stats(), st.cpu_s()
    return summarize(
        outs,
        wall,
        s1.steps - s0.steps,
        s1.generated_tokens - s0.generated_tokens,
        {k: cpu1[k] - cpu0[k] for k in cpu1},
    ), outs


def summarize(
    outs: Sequence[Outcome], wall: float, steps: int, generated: int, cpu: dict[str, float]
) -> dict[str, Any]:
    ok = [o for o in outs if o.result is not None]
    toks = sum(o.result.completion_tokens for o in ok if o.result)
    tpot = [
        (o.latency_s - o.ttft_s) * 1e3 / (o.result.completion_tokens - 1)
        for o in ok
        if o.result and o.result.completion_tokens > 1
    ]
    finish: dict[str, int] = {}
    for o in ok:
        assert o.result is not None
        finish[o.result.finish_reason] = finish.get(o.result.finish_reason, 0) + 1
    cpu_total = sum(cpu.values())
    return {
        "requests": len(outs),
        "errors": len(outs) - len(ok),
        "first_error": next((o.error for o in outs if o.error), ""),
        "failed": [i for i, o in enumerate(outs) if o.result is None],
        "finish": finish,
        "output_tokens": toks,
        "wall_s": round(wall, 3),
        "output_tok_s": round(toks / wall, 2) if wall else 0.0,
        "requests_per_s": round(len(ok) / wall, 3) if wall else 0.0,
        "latency_s_p50": round(pct([o.latency_s for o in ok], 50), 3),
        "ttft_ms_p50": round(pct([o.ttft_s * 1e3 for o in ok], 50), 1),
        "tpot_ms_p50": round(pct(tpot, 50), 1),
        "scheduler_steps": steps,
        "generated_tokens": generated,
        "ms_per_step": round(wall * 1e3 / steps, 1) if steps else 0.0,
        "stack_cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "stack_cpu_ms_per_token": round(cpu_total * 1e3 / toks, 1) if toks else 0.0,
    }


def mixed_cases(n: int) -> list[GrammarCase]:
    """The first n suite cases, round-robin over the grammar kinds."""
    by_kind: dict[str, list[GrammarCase]] = {}
    for c in SUITE:
        by_kind.setdefault(c.kind.value, []).append(c)
    out: list[GrammarCase] = []
    while len(out) < min(n, len(SUITE)):
        for lst in by_kind.values():
            if lst and len(out) < n:
                out.append(lst.pop(0))
    return out


# --- (a) compile cost ---------------------------------------------------------------------


async def compile_pass(address: str, cases: Sequence[GrammarCase]) -> dict[str, dict[str, Any]]:
    """One Compile RPC per case, one at a time, straight to the grammar service."""
    import grpc

    from radixmesh_wire.mask_step import grammar_spec
    from radixmesh_wire.pb import grammar_pb2, grammar_pb2_grpc

    out: dict[str, dict[str, Any]] = {}
    async with grpc.aio.insecure_channel(address) as chan:
        stub = grammar_pb2_grpc.GrammarStub(chan)
        for case in cases:
            req = grammar_pb2.CompileRequest(grammar=grammar_spec(case.kind.value, case.text))
            t0 = time.perf_counter()
            reply = await stub.Compile(req, timeout=300)
            out[case.name] = {
                "kind": case.kind.value,
                "ok": reply.ok,
                "cached": reply.cached,
                "server_ms": round(reply.compile_ms, 3),
                "client_ms": round((time.perf_counter() - t0) * 1e3, 3),
            }
    return out


def compile_summary(per: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ms = [v["server_ms"] for v in per.values()]
    rtt = [v["client_ms"] for v in per.values()]
    slowest = max(per, key=lambda k: per[k]["server_ms"])
    return {
        "grammars": len(per),
        "all_ok": all(v["ok"] for v in per.values()),
        "cached_replies": sum(bool(v["cached"]) for v in per.values()),
        "server_ms_median": round(statistics.median(ms), 3),
        "server_ms_p90": round(pct(ms, 90), 3),
        "server_ms_max": round(max(ms), 3),
        "server_ms_total": round(sum(ms), 3),
        "slowest": slowest,
        "client_rtt_ms_median": round(statistics.median(rtt), 3),
    }


def variant_schema(case: GrammarCase, tag: str) -> str:
    """The same schema under another cache key (a description changes no accepted string)."""
    schema = json.loads(case.text)
    schema["description"] = f"bench variant {tag}"
    return json.dumps(schema)


def reuse_round(st: BenchStack, case: GrammarCase, n: int, timeout: float) -> dict[str, Any]:
    nonce = uuid.uuid4().hex[:10]
    same = variant_schema(case, f"{nonce}-shared")
    base = constrained_request(case, constrained=False)
    runs: dict[str, Any] = {}
    for label, schemas in (
        ("same_schema", [same] * n),
        ("distinct_schemas", [variant_schema(case, f"{nonce}-{i}") for i in range(n)]),
    ):
        summary, _ = run_batch(st, [dict(base, json_schema=s) for s in schemas], n, timeout)
        runs[label] = summary
    return runs


# --- (b) mask stall from outside ----------------------------------------------------------


@dataclass
class ReplayRow:
    kind: str
    text: str
    tokens: list[int]
    stopped: bool  # finished on EOS: one more mask (the one EOS was sampled under)

    @property
    def masks(self) -> int:
        return len(self.tokens) + (1 if self.stopped else 0)


async def mask_replay(address: str, rows: Sequence[ReplayRow]) -> dict[str, Any]:
    """Replay finished requests as the scheduler drives them, all starting together: step k
    accepts every active row's token k-1 and wants its next mask. Times each round trip."""
    import grpc

    from radixmesh_wire.mask_step import MaskStepBuilder
    from radixmesh_wire.pb import grammar_pb2, grammar_pb2_grpc

    queue: asyncio.Queue[grammar_pb2.MaskRequest | None] = asyncio.Queue()

    async def requests():  # type: ignore[no-untyped-def]
        yield grammar_pb2.MaskRequest(open=grammar_pb2.OpenMasks(session_id="bench-replay"))
        while (msg := await queue.get()) is not None:
            yield msg

    rtts: list[float] = []
    service: list[float] = []
    widths: list[int] = []
    errors = 0
    encodings: dict[str, int] = {}
    row_bytes = 0
    async with grpc.aio.insecure_channel(address) as chan:
        call = grammar_pb2_grpc.GrammarStub(chan).Masks(requests())
        await call.read()  # opened
        b = MaskStepBuilder()
        for h, r in enumerate(rows):
            b.bind(h, r.kind, r.text)
        step = 0
        while True:
            active = [h for h, r in enumerate(rows) if step < r.masks]
            for h, r in enumerate(rows):
                if step and step < r.masks:  # the token sampled under the previous mask
                    b.accept(h, [r.tokens[step - 1]])
                elif step and step == r.masks:  # finished at the previous step
                    b.release(h)
            if not active:
                break
            for h in active:
                b.want(h)
            t0 = time.perf_counter()
            queue.put_nowait(grammar_pb2.MaskRequest(step=b.build(step + 1)))
            reply = await call.read()
            rtts.append((time.perf_counter() - t0) * 1e3)
            service.append(reply.result.service_ms)
            widths.append(len(active))
            errors += len(reply.result.errors)
            for row in reply.result.rows:
                name = grammar_pb2.MaskEncoding.Name(row.encoding).removeprefix("MASK_ENCODING_")
                encodings[name] = encodings.get(name, 0) + 1
                row_bytes += len(row.data)
            step += 1
        queue.put_nowait(None)
        call.cancel()
    later = rtts[1:] or rtts  # step 1 also binds every row
    return {
        "rows": len(rows),
        "steps": len(rtts),
        "row_errors": errors,
        "rows_per_step_mean": round(statistics.mean(widths), 2) if widths else 0,
        "first_step_ms": round(rtts[0], 3) if rtts else 0.0,
        "rtt_ms_mean": round(statistics.mean(later), 3) if later else 0.0,
        "rtt_ms_p50": round(pct(later, 50), 3),
        "rtt_ms_p99": round(pct(later, 99), 3),
        "service_ms_mean": round(statistics.mean(service[1:] or service), 3) if service else 0.0,
        "row_encodings": encodings,
        "row_bytes_mean": round(row_bytes / sum(widths), 1) if widths else 0.0,
    }


def replay_rows(cases: Sequence[GrammarCase], outs: Sequence[Outcome]) -> list[ReplayRow]:
    return [
        ReplayRow(c.kind.value, c.text, o.result.output_ids, o.result.finish_reason == "stop")
        for c, o in zip(cases, outs, strict=True)
        if o.result is not None
    ]


# --- the run ------------------------------------------------------------------------------

PAPER = {
    "reuse": "redoing grammar preprocessing per request: 2.4x lower throughput",
    "jump_forward": "compressed FSM: 1.6x throughput on JSON decoding",
}
STATS_GAP = (
    "GetStats has no mask stall: SchedulerStats.mask_wait_seconds (scheduler.py _masks) is "
    "kept but never exported. Proposed: api.proto Stats gets `double mask_wait_seconds = 19;` "
    "and `uint64 mask_steps = 20;` (steps that waited for a MaskStep; add the counter next to "
    "mask_wait_seconds in _masks), filled in frontend_link.GetStats; mask stall per step = "
    "mask_wait_seconds / mask_steps, and per step of the run = d(mask_wait_seconds) / d(steps). "
    "Exporting SchedulerStats.jump_forwards / jump_forward_tokens the same way would let this "
    "bench report how much of the output jump-forward wrote."
)


def throughput(
    st: BenchStack, b1: Sequence[GrammarCase], b16: Sequence[GrammarCase], timeout: float
) -> tuple[dict[str, Any], dict[str, list[Outcome]]]:
    out: dict[str, Any] = {}
    kept: dict[str, list[Outcome]] = {}
    for batch, cases, conc in (("batch1", b1, 1), ("batch16", b16, 16)):
        row: dict[str, Any] = {"grammars": [c.name for c in cases]}
        for label, constrained in (("constrained", True), ("unconstrained", False)):
            progress(f"throughput {batch} {label} ({len(cases)} requests)")
            reqs = [constrained_request(c, constrained=constrained) for c in cases]
            row[label], kept[f"{batch}_{label}"] = run_batch(st, reqs, conc, timeout)
        # Same prompts, but unconstrained outputs run to other lengths (EOS elsewhere), which
        # changes batch occupancy. So also: each unconstrained request forced to its
        # constrained twin's length (ignore_eos), the per-token cost at equal shape.
        matched = []
        for case, o in zip(cases, kept[f"{batch}_constrained"], strict=True):
            n = o.result.completion_tokens if o.result else 1
            matched.append(
                constrained_request(case, constrained=False, max_new_tokens=max(1, n))
                | {"ignore_eos": True}
            )
        progress(f"throughput {batch} unconstrained, length-matched")
        row["unconstrained_length_matched"], _ = run_batch(st, matched, conc, timeout)
        c = row["constrained"]
        for label in ("unconstrained", "unconstrained_length_matched"):
            u = row[label]
            row[f"vs_{label}"] = {
                "tok_s_ratio_constrained_over_unconstrained": _ratio(
                    c["output_tok_s"], u["output_tok_s"]
                ),
                "ms_per_step_ratio": _ratio(c["ms_per_step"], u["ms_per_step"]),
                "cpu_ms_per_token_ratio": _ratio(
                    c["stack_cpu_ms_per_token"], u["stack_cpu_ms_per_token"]
                ),
            }
        out[batch] = row
    return out, kept


def warm_up(st: BenchStack, timeout: float) -> None:
    progress("warm-up: every prompt once (model and prefix cache)")
    run_batch(
        st, [constrained_request(c, constrained=False, max_new_tokens=2) for c in SUITE], 4, timeout
    )


def jump_forward_ablation(
    st: BenchStack, cases: Sequence[GrammarCase], timeout: float, accepted: bool, message: str
) -> dict[str, Any]:
    if not accepted:
        return {
            "skipped": True,
            "note": f"the scheduler rejects --jump-forward (not implemented yet): {message}",
        }
    out: dict[str, Any] = {
        "workload": "constrained batch 16 (the throughput section's)",
        "grammars": [c.name for c in cases],
    }
    for mode in ("off", "on"):
        progress(f"jump-forward {mode}: restarting the scheduler")
        st.restart_scheduler(["--jump-forward", mode])
        with Client(st.endpoint, timeout=timeout) as c:
            wait_constrained(c)
        warm_up(st, timeout)  # the new scheduler's prefix cache starts empty
        progress(f"jump-forward {mode}: {len(cases)} constrained requests")
        out[mode], _ = run_batch(st, [constrained_request(c) for c in cases], 16, timeout)
        out[mode]["failed"] = [cases[i].name for i in out[mode]["failed"]]
    on, off = out["on"], out["off"]
    out["tok_s_ratio_on_over_off"] = _ratio(on["output_tok_s"], off["output_tok_s"])
    out["wall_ratio_off_over_on"] = _ratio(off["wall_s"], on["wall_s"])
    out["steps_ratio_off_over_on"] = _ratio(off["scheduler_steps"], on["scheduler_steps"])
    if on["errors"] or off["errors"]:
        out["valid"] = False
        out["note"] = (
            f"errors: off {off['errors']}, on {on['errors']} of {len(cases)} "
            f"(first: {on['first_error'] or off['first_error']}); ratios are not "
            "comparable"
        )
    return out


def run(ns: argparse.Namespace) -> dict[str, Any]:
    import torch  # only for the machine description

    from services.logging import configure_logging

    configure_logging("bench", "warning")  # the launcher's events must not reach stdout
    quick = ns.quick
    n_reuse = ns.reuse_n or (8 if quick else 16)
    rounds = ns.rounds or (1 if quick else 3)
    b1 = mixed_cases(3 if quick else 6)
    b16 = mixed_cases(16)
    progress("asking the scheduler's flag parser about --jump-forward")
    jf_ok, jf_msg = scheduler_accepts(["--jump-forward", "on"])
    sched_args = ["--jump-forward", ns.jump_forward] if ns.jump_forward and jf_ok else []
    report: dict[str, Any] = {
        "bench": "constrained",
        "model": ns.model,
        "quick": quick,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "stack": {
            "scheduler_args": sched_args,
            "grammar_args": ["--disable-xgrammar-cache"],
            "jump_forward_flag": ns.jump_forward or "scheduler default",
            "jump_forward_flag_accepted": jf_ok,
        },
        "paper": PAPER,
    }
    if ns.jump_forward and not jf_ok:
        report["stack"]["note"] = f"--jump-forward {ns.jump_forward} not passed: {jf_msg}"
    with bench_stack(ns.model, sched_args, ["--disable-xgrammar-cache"]) as st:
        # (a) compile cost, before any request touches the grammar service
        progress(f"compile: {len(SUITE)} grammars cold, then cached")
        cold = asyncio.run(compile_pass(st.grammar_address, SUITE))
        cached = asyncio.run(compile_pass(st.grammar_address, SUITE))
        with Client(st.endpoint, timeout=ns.timeout) as c:
            wait_constrained(c)
        warm_up(st, ns.timeout)

        # (b) throughput, rounds interleaved; the median round is reported, all are kept
        rows: list[dict[str, Any]] = []
        kept: dict[str, list[Outcome]] = {}
        for i in range(rounds):
            progress(f"throughput round {i + 1}/{rounds}")
            row, kept = throughput(st, b1, b16, ns.timeout)
            rows.append(row)
        tp = _median_round(rows)
        report["throughput"] = tp
        progress("mask stall: replaying the constrained outputs through a Masks session")
        stall: dict[str, Any] = {
            batch: asyncio.run(
                mask_replay(st.grammar_address, replay_rows(cases, kept[f"{batch}_constrained"]))
            )
            for batch, cases in (("batch1", b1), ("batch16", b16))
        }
        for batch in ("batch1", "batch16"):
            step_ms = tp[batch]["constrained"]["ms_per_step"]  # wall / scheduler steps
            stall[batch]["e2e_ms_per_step"] = step_ms
            stall[batch]["stall_fraction_of_step"] = (
                round(stall[batch]["rtt_ms_mean"] / step_ms, 4) if step_ms else None
            )
        stall["gap"] = STATS_GAP
        report["mask_stall"] = stall

        # (a, continued) reuse, and compile cost against request time
        reuse_case = max(
            (c for c in SUITE if c.kind.value == "json_schema"),
            key=lambda c: cold[c.name]["server_ms"],
        )
        reuse_rounds = []
        for i in range(rounds):
            progress(
                f"reuse round {i + 1}/{rounds}: {n_reuse} x '{reuse_case.name}', one "
                "schema vs distinct schemas"
            )
            reuse_rounds.append(reuse_round(st, reuse_case, n_reuse, ns.timeout))
        same = _median_by(reuse_rounds, "same_schema")
        distinct = _median_by(reuse_rounds, "distinct_schemas")
        req_b1 = tp["batch1"]["constrained"]["latency_s_p50"] * 1e3
        req_b16 = tp["batch16"]["constrained"]["latency_s_p50"] * 1e3
        cs = compile_summary(cold)
        report["compile"] = {
            "cold": cs,
            "cached": compile_summary(cached),
            "per_grammar_cold": cold,
            "per_grammar_cached": cached,
            "vs_request": {
                "request_ms_p50_batch1": round(req_b1, 1),
                "request_ms_p50_batch16": round(req_b16, 1),
                "cold_median_pct_of_batch1_request": round(100 * cs["server_ms_median"] / req_b1, 3)
                if req_b1
                else None,
                "cold_max_pct_of_batch1_request": round(100 * cs["server_ms_max"] / req_b1, 3)
                if req_b1
                else None,
            },
            "reuse": {
                "schema": reuse_case.name,
                "n": n_reuse,
                "cold_compile_ms": cold[reuse_case.name]["server_ms"],
                "same_schema": same,
                "distinct_schemas": distinct,
                "throughput_ratio_same_over_distinct": round(
                    same["output_tok_s"] / distinct["output_tok_s"], 3
                )
                if distinct["output_tok_s"]
                else None,
                "grammar_cpu_s_same": same["stack_cpu_s"].get("grammar"),
                "grammar_cpu_s_distinct": distinct["stack_cpu_s"].get("grammar"),
                "rounds": reuse_rounds,
            },
        }
        report["throughput_rounds"] = rows

        # (c) jump-forward ablation
        if ns.jump_forward_ablation:
            report["jump_forward"] = jump_forward_ablation(st, b16, ns.timeout, jf_ok, jf_msg)
        else:
            report["jump_forward"] = {"skipped": True, "note": "--no-jump-forward-ablation"}
    report["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return report


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _median_round(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The round whose batch-16 length-matched constrained/unconstrained ratio is the median."""
    key = "tok_s_ratio_constrained_over_unconstrained"
    ordered = sorted(
        rows, key=lambda r: r["batch16"]["vs_unconstrained_length_matched"][key] or 0.0
    )
    return ordered[len(ordered) // 2]


def _median_by(rounds: list[dict[str, Any]], label: str) -> dict[str, Any]:
    ordered = sorted((r[label] for r in rounds), key=lambda s: s["output_tok_s"])
    return dict(ordered[len(ordered) // 2])


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "constrained",
        help="constrained decoding: compile cost, grammar reuse, "
        "constrained vs unconstrained throughput, mask stall, jump-forward",
    )
    p.add_argument("--model", default="default")
    p.add_argument("--quick", action="store_true", help="fewer requests and one round")
    p.add_argument("--rounds", type=int, default=0, help="interleaved rounds (default 3; 1 quick)")
    p.add_argument(
        "--reuse-n",
        type=int,
        default=0,
        help="concurrent requests in the reuse runs (default 16; 8 quick)",
    )
    p.add_argument(
        "--jump-forward",
        choices=["on", "off"],
        default="",
        help="pass --jump-forward to the scheduler (default: its own default)",
    )
    p.add_argument(
        "--no-jump-forward-ablation",
        dest="jump_forward_ablation",
        action="store_false",
        help="skip the jump-forward off/on runs",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="per-request deadline (s): a hung request is counted, not waited for",
    )
    p.add_argument("--out", default="", help="also write the JSON here")

    def main(ns: argparse.Namespace) -> int:
        from radixmesh_bench.report import emit_report

        return emit_report(run(ns), ns.out)

    p.set_defaults(func=main)
