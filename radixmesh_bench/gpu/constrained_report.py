"""Figures and tables of part `constrained` (radixmesh_bench/gpu/constrained_gpu.py); pure, no
stack.

`summarize` turns one run (outcomes, wall time, GetStats deltas) into its figures; `validity`
checks the constrained outputs that stopped; `finish_doc` adds the rows merge.py lists, the
jump-forward on/off comparison and the goals; `render_tables` is the markdown merge.py prints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from radixmesh_bench.gpu.common import percentile
from radixmesh_bench.gpu.constrained_schemas import SCHEMAS, check_output

MODES = ("off", "on")
GOALS = {"off": 0.90, "on": 1.0}  # constrained / unconstrained tok/s at the largest batch


@dataclass
class Outcome:
    schema: str
    error: str = ""
    text: str = ""
    finish: str = ""
    tokens: int = 0
    ttft_s: float = 0.0
    itl_s: tuple[float, ...] = ()


# GetStats counters each run takes the difference of
STAT_FIELDS = (
    "steps",
    "generated_tokens",
    "mask_wait_seconds",
    "jump_forwards",
    "jump_forward_tokens",
)


def summarize(outs: Sequence[Outcome], wall: float, d: dict[str, Any]) -> dict[str, Any]:
    """One run's figures from its outcomes, wall time and GetStats deltas (pure)."""
    ok = [o for o in outs if not o.error]
    toks = sum(o.tokens for o in ok)
    ttft = [o.ttft_s * 1e3 for o in ok]
    itl = [x * 1e3 for o in ok for x in o.itl_s]
    steps = d["steps"]
    finish: dict[str, int] = {}
    for o in ok:
        finish[o.finish] = finish.get(o.finish, 0) + 1
    return {
        "requests": len(outs),
        "errors": len(outs) - len(ok),
        "first_error": next((o.error for o in outs if o.error), ""),
        "finish": finish,
        "cut_by_length": finish.get("length", 0),
        "output_tokens": toks,
        "output_tokens_per_request": round(toks / len(ok), 1) if ok else 0.0,
        "output_chars": sum(len(o.text) for o in ok),
        "wall_s": round(wall, 4),
        "tok_s": round(toks / wall, 2) if wall else 0.0,
        "requests_per_s": round(len(ok) / wall, 3) if wall else 0.0,
        "ttft_ms_p50": round(percentile(ttft, 0.5), 2),
        "ttft_ms_p99": round(percentile(ttft, 0.99), 2),
        "itl_ms_p50": round(percentile(itl, 0.5), 3),
        "itl_ms_p99": round(percentile(itl, 0.99), 3),
        "itl_samples": len(itl),
        "scheduler_steps": steps,
        "wall_ms_per_step": round(wall * 1e3 / steps, 3) if steps else None,
        "sampled_tokens": d["generated_tokens"],
        "forward_passes_per_request": round(d["generated_tokens"] / len(ok), 2) if ok else None,
        "mask_wait_s": round(d["mask_wait_seconds"], 5),
        "mask_stall_ms_per_step": round(d["mask_wait_seconds"] * 1e3 / steps, 4) if steps else None,
        "mask_stall_fraction_of_step": round(d["mask_wait_seconds"] / wall, 4) if wall else None,
        "jump_forwards": d["jump_forwards"],
        "jump_forward_tokens": d["jump_forward_tokens"],
    }


def validity(outs: Sequence[Outcome]) -> dict[str, Any]:
    """Every constrained output that stopped, checked against its schema."""
    counts = {"strict": 0, "lenient": 0, "invalid": 0}
    bad: list[dict[str, str]] = []
    for o in outs:
        if o.error or o.finish != "stop":
            continue
        verdict, msg = check_output(o.text, SCHEMAS[o.schema])
        counts[verdict] += 1
        if verdict != "strict" and len(bad) < 4:
            bad.append({"schema": o.schema, "verdict": verdict, "why": msg, "text": o.text})
    return {
        "checked": sum(counts.values()),
        "valid_strict": counts["strict"],
        "valid_lenient": counts["lenient"],
        "invalid": counts["invalid"],
        "examples_not_strict": bad,
    }


def finish_doc(doc: dict[str, Any], last: str) -> None:
    """Rows for merge, jump-forward on/off comparisons, goals and errors (pure on `doc`)."""
    modes = doc["modes"]
    for mode, res in modes.items():
        for name, r in res.items():
            for kind in ("constrained", "unconstrained_length_matched"):
                doc["rows"].append(
                    {
                        "system": "radixmesh",
                        "variant": f"jump-forward {mode}",
                        "kind": kind,
                        "path": "grpc-stack",
                        "model": doc["model"],
                        "workload": name,
                        "batch": r["batch"],
                        "input_len": doc["input_len"],
                        **r[kind],
                    }
                )
            if r["validity"]["invalid"]:
                doc["errors"].append(f"jf {mode} {name}: {r['validity']['invalid']} invalid")
            for kind in ("constrained", "unconstrained_length_matched"):
                if r[kind]["errors"]:
                    doc["errors"].append(f"jf {mode} {name} {kind}: {r[kind]['first_error']}")
    if set(MODES) <= set(modes):
        doc["jump_forward"] = {}
        for name in modes["on"]:
            on, off = modes["on"][name]["constrained"], modes["off"][name]["constrained"]
            doc["jump_forward"][name] = {
                "tok_s_on_over_off": _div(on["tok_s"], off["tok_s"]),
                # Random weights spell forced keys in odd small tokens when they sample them;
                # a jump writes the canonical tokenization, so the same document is fewer
                # tokens with jump-forward on: compare documents (and characters) per second.
                "requests_per_s_on_over_off": _div(on["requests_per_s"], off["requests_per_s"]),
                "chars_per_s_on_over_off": _div(
                    on["output_chars"] / on["wall_s"], off["output_chars"] / off["wall_s"]
                ),
                "tokens_per_request_off": off["output_tokens_per_request"],
                "tokens_per_request_on": on["output_tokens_per_request"],
                "steps_off_over_on": _div(off["scheduler_steps"], on["scheduler_steps"]),
                "passes_per_request_off": off["forward_passes_per_request"],
                "passes_per_request_on": on["forward_passes_per_request"],
                "jump_forward_tokens_share": _div(on["jump_forward_tokens"], on["output_tokens"]),
            }
    doc["goal_results"] = {
        mode: {
            "batch": last,
            "ratio": modes[mode][last]["ratio_constrained_over_unconstrained"],
            "goal": GOALS[mode],
            "met": goal_met(mode, modes[mode][last]["ratio_constrained_over_unconstrained"]),
        }
        for mode in modes
        if last in modes[mode]
    }


def goal_met(mode: str, ratio: float | None) -> bool:
    """Issue 5: >= 0.90 with jump-forward off, strictly above 1.0 with it on."""
    if ratio is None:
        return False
    return ratio >= GOALS["off"] if mode == "off" else ratio > GOALS["on"]


def _div(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def _batch_row(mode: str, name: str, r: dict[str, Any], fmt: Callable[..., str]) -> list[str]:
    """One batch of one jump-forward mode: constrained against length-matched unconstrained."""
    c, u, v = r["constrained"], r["unconstrained_length_matched"], r["validity"]
    return [
        mode,
        name,
        fmt(c["tok_s"]),
        fmt(u["tok_s"]),
        fmt(r["ratio_constrained_over_unconstrained"], 3),
        " ".join(fmt(x, 3) for x in r["ratio_rounds"]),
        f"{fmt(c['forward_passes_per_request'])} / {fmt(u['forward_passes_per_request'])}",
        fmt(c["mask_stall_ms_per_step"], 3),
        fmt(c["mask_stall_fraction_of_step"], 3),
        f"{fmt(c['ttft_ms_p50'])} / {fmt(c['ttft_ms_p99'])}",
        f"{fmt(c['itl_ms_p50'], 2)} / {fmt(c['itl_ms_p99'], 2)}",
        f"{fmt(u['itl_ms_p50'], 2)} / {fmt(u['itl_ms_p99'], 2)}",
        fmt(c["output_tokens_per_request"]),
        str(c["cut_by_length"]),
        f"{v['valid_strict']}+{v['valid_lenient']}/{v['checked']}",
    ]


def render_tables(
    doc: dict[str, Any], fmt: Callable[..., str], table: Callable[..., list[str]]
) -> list[str]:
    """Markdown for radixmesh_bench/gpu/merge.py (which passes its own cell formatter and table
    maker)."""
    date, dev = str(doc.get("date", ""))[:10], str(doc.get("device", "")).split(" (")[0]
    lines = [f"## Constrained decoding, JSON schema ({dev}, {date})", ""]
    rows = [
        _batch_row(mode, name, r, fmt)
        for mode, res in doc.get("modes", {}).items()
        for name, r in res.items()
    ]
    lines += table(
        [
            "jump-fwd",
            "batch",
            "constrained tok/s",
            "unconstrained tok/s",
            "ratio",
            "ratio rounds",
            "passes/req c / u",
            "mask stall ms/step",
            "stall / step",
            "TTFT p50/p99 ms",
            "ITL p50/p99 ms",
            "unconstrained ITL p50/p99",
            "tokens/req",
            "cut",
            "valid (strict+lenient)/stopped",
        ],
        rows,
    )
    goals = doc.get("goal_results", {})
    lines += [
        "",
        "ratio: constrained / length-matched unconstrained output tok/s (each unconstrained "
        "request as long as its constrained twin, ignore_eos). passes/req: tokens sampled per "
        "request (jump-forward writes the rest). Goals at the largest batch: "
        + "; ".join(
            f"jump-forward {m}: {fmt(g['ratio'], 3)} vs {g['goal']} "
            f"({'met' if g['met'] else 'missed'})"
            for m, g in goals.items()
        ),
        "",
    ]
    jf = doc.get("jump_forward", {})
    if jf:
        head = ["batch", "requests/s on / off", "chars/s on / off", "tok/s on / off"]
        head += ["steps off / on", "passes/req off / on", "tokens/req off / on", "jumped share"]
        body = [
            [
                n,
                fmt(x.get("requests_per_s_on_over_off"), 3),
                fmt(x.get("chars_per_s_on_over_off"), 3),
                fmt(x.get("tok_s_on_over_off"), 3),
                fmt(x.get("steps_off_over_on"), 3),
                f"{fmt(x.get('passes_per_request_off'))} / {fmt(x.get('passes_per_request_on'))}",
                f"{fmt(x.get('tokens_per_request_off'))} / {fmt(x.get('tokens_per_request_on'))}",
                fmt(x.get("jump_forward_tokens_share"), 3),
            ]
            for n, x in jf.items()
        ]
        lines += [
            "Jump-forward on vs off (constrained runs; the same schemas and request "
            "counts, so requests/s compares whole documents):",
            "",
        ]
        lines += table(head, body)
        lines.append("")
    return lines
