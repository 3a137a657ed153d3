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
import os
import platform
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from radixmesh.api import Client

from grammar_service.suite import SUITE, GrammarCase
from radixmesh_bench.constrained_grammar import (
    compile_pass,
    compile_summary,
    mask_replay,
    replay_rows,
    reuse_round,
)
from radixmesh_bench.constrained_requests import (
    BenchStack,
    Outcome,
    bench_stack,
    constrained_request,
    mixed_cases,
    run_batch,
    scheduler_accepts,
    wait_constrained,
)
from radixmesh_bench.stack import progress

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


def _report_head(ns: argparse.Namespace, sched_args: list[str], jf_ok: bool) -> dict[str, Any]:
    import torch  # only for the machine description

    return {
        "bench": "constrained",
        "model": ns.model,
        "quick": ns.quick,
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


def _mask_stall(
    st: BenchStack,
    tp: dict[str, Any],
    batches: dict[str, list[GrammarCase]],
    kept: dict[str, list[Outcome]],
) -> dict[str, Any]:
    """(b) the mask stall: the constrained outputs replayed through a Masks session of ours."""
    progress("mask stall: replaying the constrained outputs through a Masks session")
    stall: dict[str, Any] = {
        batch: asyncio.run(
            mask_replay(st.grammar_address, replay_rows(cases, kept[f"{batch}_constrained"]))
        )
        for batch, cases in batches.items()
    }
    for batch in batches:
        step_ms = tp[batch]["constrained"]["ms_per_step"]  # wall / scheduler steps
        stall[batch]["e2e_ms_per_step"] = step_ms
        stall[batch]["stall_fraction_of_step"] = (
            round(stall[batch]["rtt_ms_mean"] / step_ms, 4) if step_ms else None
        )
    stall["gap"] = STATS_GAP
    return stall


def _compile_report(
    st: BenchStack,
    cold: dict[str, dict[str, Any]],
    cached: dict[str, dict[str, Any]],
    tp: dict[str, Any],
    rounds: int,
    n_reuse: int,
    timeout: float,
) -> dict[str, Any]:
    """(a, continued) reuse, and compile cost against request time."""
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
        reuse_rounds.append(reuse_round(st, reuse_case, n_reuse, timeout))
    same = _median_by(reuse_rounds, "same_schema")
    distinct = _median_by(reuse_rounds, "distinct_schemas")
    req_b1 = tp["batch1"]["constrained"]["latency_s_p50"] * 1e3
    req_b16 = tp["batch16"]["constrained"]["latency_s_p50"] * 1e3
    cs = compile_summary(cold)
    return {
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


def run(ns: argparse.Namespace) -> dict[str, Any]:
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
    report = _report_head(ns, sched_args, jf_ok)
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
        report["mask_stall"] = _mask_stall(st, tp, {"batch1": b1, "batch16": b16}, kept)
        report["compile"] = _compile_report(st, cold, cached, tp, rounds, n_reuse, ns.timeout)
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
