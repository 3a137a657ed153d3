"""The rows and tables of the GPU results page (radixmesh_bench/gpu/merge.py): how each kind of
result row reads in its table, the tables' headers and notes, and the per-kernel breakdown of a
`profile` document. Pure functions of the JSON documents."""

from __future__ import annotations

import math
from typing import Any

Row = list[str]


def fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e6):
            return f"{v:.3e}"
        if v != 0 and abs(v) < 1:
            return f"{v:.3g}"
        return f"{v:,.{digits}f}"
    return str(v)


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def gpu_idle(r: dict[str, Any]) -> str:
    busy, wall = r.get("worker_busy_ms_per_step"), r.get("wall_ms_per_step")
    if not busy or not wall:
        return "-"
    return fmt(1 - busy / wall, 3)


def _gemv_table(forms: list[dict[str, Any]]) -> list[str]:
    """Each decode form's projections (GEMVs): weight size, calls and time against the floor."""
    lines: list[str] = []
    gem = [
        [
            f["form"],
            g["proj"],
            "x".join(str(x) for x in g["shape"]),
            fmt(g["MB"], 1),
            fmt(g["calls_per_step"], 0),
            fmt(g["ms_per_call"] * 1e3, 1),
            fmt(g["floor_ms"] * 1e3, 1),
            fmt(g["fraction_of_floor"], 2),
            fmt(g["GBps"], 0),
        ]
        for f in forms
        for g in f.get("gemv", [])
    ]
    if gem:
        lines += md_table(
            [
                "form",
                "projection",
                "weight",
                "MB",
                "calls/step",
                "us/call",
                "floor us",
                "floor / time",
                "GB/s",
            ],
            gem,
        )
        lines.append("")
    return lines


def profile_tables(d: dict[str, Any]) -> list[str]:
    prof = d.get("profile") or {}
    forms = prof.get("forms") or []
    if not forms:
        return []
    date, dev = str(d.get("date", ""))[:10], str(d.get("device", "")).split(" (")[0]
    lines = [f"## Batch-1 decode step, kernel by kernel ({dev}, {date})", ""]
    cats = sorted({c for f in forms for c in f.get("categories_ms", {})})
    lines += md_table(
        [
            "form",
            "GPU fwd ms",
            "step ms",
            "kernels/step",
            "kernel sum ms",
            *[f"{c} ms" for c in cats],
            "weight floor ms",
            "floor / GPU fwd",
        ],
        [
            [
                f["form"],
                fmt(f["graph_replay_gpu_ms"], 3),
                fmt(f["decode_step_ms_median"], 3),
                fmt(f["kernels_per_step"], 0),
                fmt(f["kernel_sum_ms"], 3),
                *[fmt(f.get("categories_ms", {}).get(c, 0.0), 3) for c in cats],
                fmt(f["weight_floor_ms"], 3),
                fmt(f["roofline_fraction_gpu_forward"], 3),
            ]
            for f in forms
        ],
    )
    lines.append("")
    lines += _gemv_table(forms)
    for f in forms:
        ks = f.get("kernels", [])[:15]
        if not ks:
            continue
        lines += [f"Top kernels, {f['form']} ({f.get('kernel_source', '')}):", ""]
        lines += md_table(
            ["kernel", "category", "calls/step", "us/step"],
            [
                [
                    k["kernel"][:90].replace("|", "/"),
                    k["category"],
                    fmt(k["calls_per_step"], 0),
                    fmt(k["us_per_step"], 1),
                ]
                for k in ks
            ],
        )
        lines.append("")
    return lines


SERVING_HEADER = [
    "part",
    "system",
    "variant",
    "workload",
    "requests",
    "in / out tokens",
    "req/s",
    "out tok/s",
    "in tok/s (computed)",
    "TTFT p50 / p99 ms",
    "ITL p50 / p99 ms",
    "hit rate (optimal)",
    "radix share",
    "roofline",
    "device",
    "date",
]


def serving_row(d: dict[str, Any], r: dict[str, Any], dev: str, date: str) -> list[str]:
    """A row of parts sharegpt / gsp / mmlu (radixmesh_bench/gpu/serving.py)."""
    opt = r.get("optimal_hit_rate")
    variant = r.get("variant", "")
    running = (d.get("config") or {}).get("max_running")
    if running and r.get("system") == "radixmesh":
        variant += f", max-running {running}"
    return [
        d["part"],
        r.get("system", ""),
        variant,
        str(r.get("workload", "")),
        fmt(r.get("requests")),
        f"{fmt(r.get('input_tokens'))} / {fmt(r.get('output_tokens'))}",
        fmt(r.get("req_s"), 2),
        fmt(r.get("output_tok_s")),
        f"{fmt(r.get('input_tok_s'), 0)} ({fmt(r.get('computed_prefill_tok_s'), 0)})",
        f"{fmt(r.get('ttft_ms_p50'))} / {fmt(r.get('ttft_ms_p99'))}",
        f"{fmt(r.get('itl_ms_p50'), 2)} / {fmt(r.get('itl_ms_p99'), 2)}",
        f"{fmt(r.get('hit_rate'), 3)}" + (f" ({fmt(opt, 3)})" if opt is not None else ""),
        "-" if r.get("radix_share") is None else f"{r['radix_share'] * 100:.4f} %",
        fmt(r.get("roofline_fraction"), 3),
        dev,
        date,
    ]


def serving_notes(docs: list[dict[str, Any]]) -> list[str]:
    out = []
    for d in docs:
        sp = d.get("speedup_radix_tree_vs_off") or {}
        if sp:
            out.append(
                f"- {d['part']} ({str(d.get('date', ''))[:10]}): radix tree vs off "
                f"{fmt(sp.get('req_s'), 2)}x requests/s, "
                f"{fmt(sp.get('output_tok_s'), 2)}x output tok/s"
            )
        if d.get("speedup_vs_hf_on_subset"):
            out.append(
                f"- {d['part']} ({str(d.get('date', ''))[:10]}): ours vs HF on the same "
                f"subset {fmt(d['speedup_vs_hf_on_subset'], 2)}x output tok/s"
            )
    return out


def startup_row(r: dict[str, Any], dev: str, date: str) -> list[str]:
    """A row of part startup (radixmesh_bench/gpu/startup_part.py): one start-up that must fail
    (or, for
    flashinfer_missing, fall back), its exit code, seconds, judgement and message."""
    msg = str(r.get("message") or "-").replace("|", "/").replace("\n", " ")
    if len(msg) > 240:
        msg = msg[:237] + "..."
    extra = ""
    if r.get("variant") == "flashinfer_missing":
        fb = r.get("fallback_run") or {}
        extra = f"; text {fb.get('text', '-')!r}".replace("|", "/")
    problems = "; ".join(r.get("problems") or []).replace("|", "/")
    return [
        str(r.get("variant", "")),
        str(r.get("what", "")),
        fmt(r.get("returncode")),
        fmt(r.get("wall_s"), 1),
        ("pass" if r.get("pass") else f"FAIL: {problems}"),
        msg + extra,
        dev,
        date,
    ]


def perf_row(d: dict[str, Any], r: dict[str, Any], dev: str, date: str) -> list[str]:
    return [
        d["part"],
        r.get("system", ""),
        r.get("variant", ""),
        r.get("path", ""),
        fmt(r.get("batch")),
        f"{r.get('input_len', '-')}/{r.get('output_len', '-')}",
        fmt(r.get("tok_s")),
        fmt(r.get("decode_step_ms_median"), 2),
        fmt(r.get("graph_replay_gpu_ms"), 2),
        fmt(r.get("prefill_ms"), 1),
        fmt(r.get("roofline_fraction"), 2),
        fmt(d.get("copy_bandwidth_GBps"), 0),
        dev,
        date,
    ]


def latency_row(d: dict[str, Any], r: dict[str, Any], dev: str, date: str) -> list[str]:
    return [
        d["part"],
        r.get("path", ""),
        str(r.get("workload", "")),
        fmt(r.get("batch")),
        f"{r.get('input_len', '-')}/{r.get('output_len', '-')}",
        fmt(r.get("tok_s")),
        fmt(r.get("ttft_ms_p50"), 1),
        fmt(r.get("ttft_ms_p99"), 1),
        fmt(r.get("itl_ms_p50"), 2),
        fmt(r.get("itl_ms_p99"), 2),
        fmt(r.get("overhead_vs_in_process"), 3),
        fmt(r.get("worker_busy_ms_per_step"), 2),
        fmt(r.get("wall_ms_per_step"), 2),
        gpu_idle(r),
        dev,
        date,
    ]


def numerics_row(d: dict[str, Any], r: dict[str, Any], dev: str, date: str) -> list[str]:
    return [
        d["part"],
        r.get("system", ""),
        r.get("variant", ""),
        fmt(r.get("rel_err")),
        fmt(r.get("rel_err_prefill")),
        fmt(r.get("rel_err_decode")),
        fmt(r.get("ratio_vs_hf_bf16"), 3),
        fmt(r.get("nan")),
        fmt(r.get("argmax_agree"), 3),
        fmt(r.get("pass")),
        dev,
        date,
    ]


def other_row(d: dict[str, Any], r: dict[str, Any], dev: str, date: str) -> list[str]:
    return [
        d["part"],
        r.get("system", ""),
        r.get("variant", ""),
        fmt(r.get("returncode")),
        str(r.get("summary", "")),
        dev,
        date,
    ]


def rows_of(d: dict[str, Any], r: dict[str, Any], dev: str, date: str) -> list[tuple[str, Row]]:
    """The (section, row) pairs one result row contributes to (a stack row is in two)."""
    if r.get("table") == "serving":
        return [("serving", serving_row(d, r, dev, date))]
    if r.get("table") == "startup":
        return [("startup", startup_row(r, dev, date))]
    if "tok_s" in r:
        out = [("perf", perf_row(d, r, dev, date))]
        if "itl_ms_p50" in r:
            out.append(("lat", latency_row(d, r, dev, date)))
        return out
    if "rel_err" in r:
        return [("nums", numerics_row(d, r, dev, date))]
    return [("other", other_row(d, r, dev, date))]


PERF_HEADER = [
    "part",
    "system",
    "variant",
    "path",
    "batch",
    "in/out",
    "tok/s",
    "decode ms/step",
    "GPU fwd ms",
    "prefill ms",
    "roofline",
    "copy GB/s",
    "device",
    "date",
]
PERF_NOTE = (
    "roofline: (weight bytes / copy bandwidth measured in the same run) / "
    "decode step time. GPU fwd ms: one replay of the decode graph timed with CUDA "
    "events (the rest of a step is host work)."
)
LATENCY_HEADER = [
    "part",
    "path",
    "workload",
    "batch",
    "in/out",
    "tok/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "ITL p50 ms",
    "ITL p99 ms",
    "overhead",
    "busy ms/step",
    "wall ms/step",
    "GPU idle",
    "device",
    "date",
]
LATENCY_NOTE = (
    "overhead: 1 - stack tok/s / in-process tok/s of the same run (goal <= "
    "0.10). busy ms/step: time inside the model worker's ModelRunner.step; wall "
    "ms/step: the workload's wall time over the scheduler's steps; GPU idle: "
    "1 - busy / wall (the worker waits on scheduler and transport between "
    "steps). In-process TTFT is the step that admits every request; its ITL "
    "samples are decode steps."
)
SERVING_NOTE = (
    "All requests submitted at once (rate inf), EOS ignored. in tok/s: prompt "
    "tokens / wall (computed: those not served from the cache). hit rate: cached "
    "/ prompt tokens from GetStats (offline optimum). radix share: radix "
    "bookkeeping seconds / wall (paper: < 0.3 % without reuse). roofline: "
    "max(bandwidth floor, compute floor) for the steps taken / wall "
    "(radixmesh_bench/gpu/serving_workloads.py). HF rows: static batches, latencies "
    "estimated per batch."
)
NUMERICS_HEADER = [
    "part",
    "system",
    "variant",
    "rel err",
    "prefill",
    "decode",
    "ratio vs HF bf16",
    "NaN",
    "argmax agree",
    "pass",
    "device",
    "date",
]
STARTUP_HEADER = ["case", "what", "exit", "seconds", "judged", "message", "device", "date"]
STARTUP_NOTE = (
    "exit 2 and one `startup_failed` line naming the problem and the fix, except "
    "flashinfer_missing: the stack serves on the reference attention (exit: the "
    "launcher's after Ctrl-C; seconds: until ready). docs/gpu.md, Start-up errors."
)
OTHER_HEADER = ["part", "system", "what", "rc", "summary", "device", "date"]
