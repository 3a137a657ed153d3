"""Merge GPU benchmark JSON documents (bench/gpu/run.py output) into markdown tables.

    python bench/gpu/merge.py results/gpu/*.json [-o results/gpu/README.md]

Throughput rows (with `tok_s`) form one table, numerics rows (with `rel_err`) another; each row
names the document's part, device and date, so runs from several machines or days can sit in
one table. Rows from later through-the-stack runs (`path: grpc-stack`) merge the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any


def _fmt(v: Any, digits: int = 1) -> str:
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


def load(paths: list[Path]) -> list[dict[str, Any]]:
    docs = []
    for p in paths:
        if p.is_dir():
            docs += load(sorted(p.glob("*.json")))
            continue
        try:
            d = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"skipping {p}: {exc}", file=sys.stderr)
            continue
        if isinstance(d, dict) and "rows" in d and "part" in d:
            d["_file"] = p.name
            docs.append(d)
    return docs


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def render(docs: list[dict[str, Any]]) -> str:
    perf, nums, other = [], [], []
    for d in docs:
        date = str(d.get("date", ""))[:10]
        dev = str(d.get("device", "")).split(" (")[0]
        for r in d["rows"]:
            if "tok_s" in r:
                perf.append([d["part"], r.get("system", ""), r.get("variant", ""),
                             r.get("path", ""), _fmt(r.get("batch")),
                             f"{r.get('input_len', '-')}/{r.get('output_len', '-')}",
                             _fmt(r.get("tok_s")), _fmt(r.get("decode_step_ms_median"), 2),
                             _fmt(r.get("prefill_ms"), 1), _fmt(r.get("roofline_fraction"), 2),
                             _fmt(d.get("copy_bandwidth_GBps"), 0), dev, date])
            elif "rel_err" in r:
                nums.append([d["part"], r.get("system", ""), r.get("variant", ""),
                             _fmt(r.get("rel_err")), _fmt(r.get("rel_err_prefill")),
                             _fmt(r.get("rel_err_decode")), _fmt(r.get("ratio_vs_hf_bf16"), 3),
                             _fmt(r.get("nan")), _fmt(r.get("argmax_agree"), 3),
                             _fmt(r.get("pass")), dev, date])
            else:
                other.append([d["part"], r.get("system", ""), r.get("variant", ""),
                              _fmt(r.get("returncode")), str(r.get("summary", "")), dev, date])
    lines: list[str] = []
    if perf:
        lines += ["## Throughput", ""]
        lines += _table(["part", "system", "variant", "path", "batch", "in/out", "tok/s",
                         "decode ms/step", "prefill ms", "roofline", "copy GB/s", "device",
                         "date"], perf)
        lines += ["", "roofline: (weight bytes / copy bandwidth measured in the same run) / "
                  "decode step time.", ""]
    if nums:
        lines += ["## Numerics (teacher-forced logits vs HF fp32)", ""]
        lines += _table(["part", "system", "variant", "rel err", "prefill", "decode",
                         "ratio vs HF bf16", "NaN", "argmax agree", "pass", "device", "date"],
                        nums)
        lines += ["", "pass: ratio <= 1.5 and no NaN (DESIGN.md section 3).", ""]
    if other:
        lines += ["## Other", ""]
        lines += _table(["part", "system", "what", "rc", "summary", "device", "date"], other)
        lines.append("")
    errs = [(d["part"], e) for d in docs for e in d.get("errors", [])]
    if errs:
        lines += ["## Errors", ""] + [f"- {p}: {e}" for p, e in errs] + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args(argv)
    text = render(load(args.paths))
    if args.output:
        args.output.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
