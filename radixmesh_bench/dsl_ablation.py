"""`radixmesh bench dsl`: the paper's frontend ablation (Figure 8c) on a DSL workload.

Workload: `run_batch` over 32 few-shot QA programs. Every program starts with the same
few-shot prefix (instructions and worked examples, ~350 tokens), asks a different question
and generates a short answer (at most 8 tokens, stop at a newline), at temperature 0.

Configurations (the DSL's ablation switches, `rm.global_config`):
- full: frontend hint and frontend parallelism on (run_batch warms the program's traced
  constant prefix once, then runs the programs concurrently);
- no_frontend_parallelism: `enable_parallelism=False` (the programs run one at a time);
- no_frontend_hint: `enable_fork_hint=False` (no prefix warm-up: the concurrent programs
  reach the server with the prefix still uncached).

Every run gets its own prefix (a distinct session line at the top), so each starts with its
prefix cold in the radix cache; the configurations are interleaved over `--rounds` rounds
to spread the noise of a shared machine. Reported per configuration (median over rounds,
plus every round): wall time and programs/s; CPU seconds of the stack's services and of the
client (steadier than wall time on a shared machine); the cache hit rate the DSL saw
(`BatchResult`: the programs' requests and the warm-up) and the server's (`GetStats` deltas
over the run: prompt, cached and generated tokens, scheduler steps); and how many answers
are correct (a sanity check that every configuration computes the same thing).

Also reported: the lines-of-code comparison of the paper's Figure 2 written with the DSL
(tests/integration/test_dsl_live.py) and with the plain client library
(client/radixmesh/examples/figure2_plain.py): non-blank, non-comment lines of the program bodies.

    radixmesh bench dsl [--rounds 3] [--endpoint HOST:PORT] [--out FILE]
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import statistics
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import radixmesh as rm
from radixmesh.api import Client
from radixmesh.lang.roles import RoleRenderer

from radixmesh_bench.stack import local_stack, progress

INSTRUCTIONS = (
    "You are a quiz assistant. Read each question carefully and answer it with a single "
    "word or a number, without any explanation, punctuation or extra words. The questions "
    "cover geography, science, nature, language and everyday knowledge; each answer is a "
    "well-known fact that most people learn at school. Follow the format of the examples "
    "exactly: the question on one line, then the answer on the next line.\n\n"
)
SHOTS = [
    ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of Egypt?", "Cairo"),
    ("How many legs does a spider have?", "Eight"),
    ("What color is grass?", "Green"),
    ("What is the opposite of up?", "Down"),
    ("Which planet is known as the red planet?", "Mars"),
    ("What do bees make?", "Honey"),
    ("How many days are there in a week?", "Seven"),
    ("What is frozen water called?", "Ice"),
    ("Which animal is known as the king of the jungle?", "Lion"),
    ("What is the capital of Canada?", "Ottawa"),
    ("What gas do plants absorb from the air?", "Carbon dioxide"),
    ("How many continents are there on Earth?", "Seven"),
    ("What is the largest ocean on Earth?", "Pacific"),
    ("Which language is mainly spoken in Brazil?", "Portuguese"),
    ("What is the boiling point of water in degrees Celsius?", "100"),
]
QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the opposite of hot?", "Cold"),
    ("What is the largest planet?", "Jupiter"),
    ("What color is the sky on a clear day?", "Blue"),
    ("How many legs does a dog have?", "Four|4"),
    ("What is the opposite of day?", "Night"),
    ("What do cows drink?", "Water"),
    ("What is the capital of Russia?", "Moscow"),
    ("What is the capital of China?", "Beijing"),
    ("What is the closest star to Earth?", "Sun"),
    ("What color is snow?", "White"),
    ("How many hours are there in a day?", "24|Twenty-four"),
    ("What is the opposite of big?", "Small"),
    ("Which animal says moo?", "Cow"),
    ("What is the capital of England?", "London"),
    ("What is the main language of Mexico?", "Spanish"),
    ("What is the opposite of fast?", "Slow"),
    ("What is the capital of Greece?", "Athens"),
    ("Which season comes after winter?", "Spring"),
    ("What color are bananas?", "Yellow"),
    ("How many wheels does a bicycle have?", "Two|2"),
    ("What is the capital of Portugal?", "Lisbon"),
    ("What is the natural satellite of Earth?", "Moon"),
    ("What is the opposite of wet?", "Dry"),
    ("Which bird is a symbol of peace?", "Dove"),
    ("What is the capital of Ireland?", "Dublin"),
    ("What is the capital of Austria?", "Vienna"),
    ("How many months are there in a year?", "Twelve|12"),
    ("What metal is liquid at room temperature?", "Mercury"),
]

CONFIGS = {
    "full": {"enable_fork_hint": True, "enable_parallelism": True},
    "no_frontend_parallelism": {"enable_fork_hint": True, "enable_parallelism": False},
    "no_frontend_hint": {"enable_fork_hint": False, "enable_parallelism": True},
}


def few_shot_program(session: str) -> rm.SglFunction:
    """The program for one run. The session line is a constant of the program (not an
    argument), so it belongs to the traced constant prefix that run_batch warms."""

    @rm.function
    def few_shot_qa(s: rm.ProgramState, question: str) -> None:
        s += "Session " + session + ".\n" + INSTRUCTIONS
        for q, a in SHOTS:
            s += "Question: " + q + "\nAnswer: " + a + "\n\n"
        s += "Question: " + question + "\nAnswer:" + rm.gen("answer", stop="\n")

    return few_shot_qa


def _server_counts(c: Client) -> dict[str, int]:
    st = c.stats()
    return {
        "prompt_tokens": st.prompt_tokens,
        "cached_prompt_tokens": st.cached_prompt_tokens,
        "generated_tokens": st.generated_tokens,
        "steps": st.steps,
    }


def children_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process's children: the services of
    a stack this bench started (0 with --endpoint). Less sensitive than wall time to other
    work on a shared machine."""
    me, total = os.getpid(), 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process went away, or no /proc
        if int(fields[1]) == me:  # ppid; utime and stime are the 14th and 15th fields
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def run_config(
    backend: rm.GrpcBackend, api: Client, name: str, n: int, max_tokens: int, threads: int | str
) -> dict[str, Any]:
    """One run_batch of `n` programs under configuration `name`, on a fresh prefix."""
    for key, value in CONFIGS[name].items():
        setattr(rm.global_config, key, value)
    program = few_shot_program(uuid.uuid4().hex[:12])
    batch = [{"question": q} for q, _ in QUESTIONS[:n]]
    before = _server_counts(api)
    cpu0, own0 = children_cpu_s(), time.process_time()
    t0 = time.perf_counter()
    states = program.run_batch(
        batch, backend=backend, num_threads=threads, temperature=0, max_new_tokens=max_tokens
    )
    wall = time.perf_counter() - t0
    stack_cpu, client_cpu = children_cpu_s() - cpu0, time.process_time() - own0
    after = _server_counts(api)
    delta = {k: after[k] - before[k] for k in before}
    failed = [i for i, s in enumerate(states) if s.error() is not None]
    answers = [None if i in failed else s["answer"].strip() for i, s in enumerate(states)]
    return {
        "wall_s": round(wall, 3),
        "programs_per_s": round(n / wall, 3),
        "stack_cpu_s": round(stack_cpu, 2),
        "client_cpu_s": round(client_cpu, 2),
        "dsl_cache_hit_rate": round(states.cache_hit_rate(), 4),
        "dsl_prompt_tokens": states.prompt_tokens(),
        "dsl_cached_tokens": states.cached_tokens(),
        "prefix_warm_tokens": states.prefix_warm.prompt_tokens if states.prefix_warm else 0,
        "server_cache_hit_rate": round(delta["cached_prompt_tokens"] / delta["prompt_tokens"], 4)
        if delta["prompt_tokens"]
        else 0.0,
        "server": delta,
        "failed_programs": failed,
        "answers": answers,
    }


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 4)


def correct(answer: str | None, expected: str) -> bool:
    """Case-insensitive; `expected` may list alternatives ("Four|4")."""
    return answer is not None and answer.lower() in expected.lower().split("|")


def summarize(name: str, runs: list[dict[str, Any]], expected: list[str]) -> dict[str, Any]:
    return {
        "config": CONFIGS[name],
        "wall_s_median": _median(runs, "wall_s"),
        "wall_s_min": min(r["wall_s"] for r in runs),
        "programs_per_s_median": _median(runs, "programs_per_s"),
        "stack_cpu_s_median": _median(runs, "stack_cpu_s"),
        "client_cpu_s_median": _median(runs, "client_cpu_s"),
        "server_steps_median": statistics.median(r["server"]["steps"] for r in runs),
        "dsl_cache_hit_rate_median": _median(runs, "dsl_cache_hit_rate"),
        "server_cache_hit_rate_median": _median(runs, "server_cache_hit_rate"),
        # Each run has its own session line, so answers may differ a little between runs.
        "correct_answers_per_round": [
            sum(correct(a, e) for a, e in zip(r["answers"], expected, strict=True)) for r in runs
        ],
        "rounds": runs,
    }


# ---- lines of code ----------------------------------------------------------------------------


def body_loc(path: Path, function: str) -> int:
    """Non-blank, non-comment lines of a top-level function's body (docstring excluded)."""
    source = path.read_text()
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    body = node.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    lines = source.splitlines()[body[0].lineno - 1 : node.end_lineno]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def loc_comparison(root: Path) -> dict[str, Any] | None:
    dsl = root / "tests" / "integration" / "test_dsl_live.py"
    plain = root / "client" / "examples" / "figure2_plain.py"
    if not (dsl.exists() and plain.exists()):
        return None  # not run from a source checkout
    n_dsl = body_loc(dsl, "multi_dimensional_judge")
    n_plain = body_loc(plain, "multi_dimensional_judge")
    return {
        "dsl": {"file": str(dsl.relative_to(root)), "lines": n_dsl},
        "plain": {"file": str(plain.relative_to(root)), "lines": n_plain},
        "ratio": round(n_plain / n_dsl, 2),
        "paper_ratio": 2.1,
    }


# ---- driver -----------------------------------------------------------------------------------


def run(ns: argparse.Namespace) -> dict[str, Any]:
    n = min(ns.programs, len(QUESTIONS))
    order = list(CONFIGS) if not ns.only else [c for c in CONFIGS if c in ns.only]
    report: dict[str, Any] = {
        "bench": "dsl_ablation",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "workload": {
            "programs": n,
            "max_tokens": ns.max_tokens,
            "rounds": ns.rounds,
            "threads": ns.threads,
            "shots": len(SHOTS),
        },
    }
    saved = (rm.global_config.enable_fork_hint, rm.global_config.enable_parallelism)
    with local_stack(ns.model, endpoint=ns.endpoint) as ep:
        backend = rm.RuntimeEndpoint(ep, timeout=600)
        api = Client(ep, timeout=600)
        try:
            prefix = (
                few_shot_program(uuid.uuid4().hex[:12])
                .trace()
                .constant_prefix(lambda: RoleRenderer(backend.model_info()))
            )
            report["workload"]["prefix_tokens"] = len(backend.tokenize(prefix))
            report["model"] = backend.model_info().model_name
            progress("warm-up")
            run_config(backend, api, "full", 4, ns.max_tokens, ns.threads)
            runs: dict[str, list[dict[str, Any]]] = {c: [] for c in order}
            for r in range(ns.rounds):
                for name in order:
                    progress(f"round {r + 1}/{ns.rounds}: {name}")
                    runs[name].append(run_config(backend, api, name, n, ns.max_tokens, ns.threads))
        finally:
            rm.global_config.enable_fork_hint, rm.global_config.enable_parallelism = saved
            backend.close()
            api.close()
    expected = [a for _, a in QUESTIONS[:n]]
    report["configs"] = {name: summarize(name, runs[name], expected) for name in order}
    if "full" in runs:
        base = report["configs"]["full"]["programs_per_s_median"]
        for name in order:
            cfg = report["configs"][name]
            cfg["throughput_vs_full"] = round(cfg["programs_per_s_median"] / base, 3)
    report["loc"] = loc_comparison(Path(__file__).resolve().parents[1])
    return report


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("dsl", help="DSL frontend ablation (paper Fig. 8c) and Figure 2 LOC")
    p.add_argument("--model", default="default")
    p.add_argument("--endpoint", default="", help="use a running stack instead of starting one")
    p.add_argument("--programs", type=int, default=32, help=f"at most {len(QUESTIONS)}")
    p.add_argument("--rounds", type=int, default=3, help="runs per configuration")
    p.add_argument("--max-tokens", type=int, default=8, help="answer length limit")
    p.add_argument("--threads", default="auto", help="run_batch num_threads")
    p.add_argument("--only", nargs="*", default=[], help="configurations to run")
    p.add_argument("--out", default="", help="also write the JSON here")

    def main(ns: argparse.Namespace) -> int:
        if ns.threads != "auto":
            ns.threads = int(ns.threads)
        from radixmesh_bench.report import emit_report

        return emit_report(run(ns), ns.out)

    p.set_defaults(func=main)
