"""The pieces of `radixmesh bench constrained` (constrained.py) that send requests: one chat
prompt per suite grammar with its output budget, the constrained request for a suite case, the
CPU stack the bench starts (radixmesh_bench.stack), and running a batch of requests with each
one's outcome. The integration tests send the same requests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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
