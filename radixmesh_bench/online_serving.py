"""`radixmesh bench serving`: online serving the way `sglang.bench_serving` measures it.

Requests (the committed ShareGPT sample, decoded to text, or random lengths) arrive as a
Poisson process at each given rate (or all at once: rate inf), optionally capped at a maximum
concurrency, and stream through one of three clients:

- `sglang`: POST /generate, SSE with cumulative text (bench_serving --backend sglang);
- `openai`: POST /v1/completions, SSE (bench_serving --backend sglang-oai / vllm);
- `grpc`:   the project's own gRPC API (radixmesh.api.AsyncClient), for the HTTP overhead.

Per run: request throughput, input/output tok/s, TTFT / ITL / E2E mean, p50, p90, p99 (ms),
as JSON; with --plot, a PNG of latency against request rate per client (matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import math
import random
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from radixmesh_bench.serving_clients import Out, Req, RunSpec, drive
from radixmesh_bench.stack import add_model_flags, model_source, pct, progress

DATA = Path(__file__).resolve().parent / "data" / "sharegpt_2000.json.gz"


# -- workloads -----------------------------------------------------------------------------------
def sharegpt(tok: Any, n: int, max_output: int, max_input: int) -> list[Req]:
    """The committed sample's prompts (Llama-3.1 ids) as text, re-measured in the served
    model's tokens; output lengths capped at max_output, prompts longer than max_input
    dropped (a small CPU model's context)."""
    from transformers import AutoTokenizer

    from model_service.random_configs import bundled_tokenizer_dir

    with gzip.open(DATA) as f:
        doc = json.loads(f.read())
    llama = AutoTokenizer.from_pretrained(bundled_tokenizer_dir())
    out: list[Req] = []
    for ids, olen in zip(doc["prompt_ids"], doc["output_lens"], strict=True):
        text = str(llama.decode(ids, skip_special_tokens=True))
        plen = len(tok.encode(text))
        if plen <= max_input:
            out.append(Req(text, plen, min(int(olen), max_output)))
        if len(out) == n:
            break
    return out


def random_lengths(tok: Any, n: int, input_len: int, output_len: int, seed: int) -> list[Req]:
    """Random token ids of the served model, lengths uniform in [len/2, len]."""
    rng = random.Random(seed)
    out = []
    vocab = min(len(tok), 30000)
    for _ in range(n):
        ilen = rng.randint(max(input_len // 2, 1), input_len)
        text = tok.decode([rng.randrange(100, vocab) for _ in range(ilen)])
        out.append(
            Req(text, len(tok.encode(text)), rng.randint(max(output_len // 2, 1), output_len))
        )
    return out


def run_one(spec: RunSpec, procs: int = 1) -> dict[str, Any]:
    """One run; with `procs` > 1 the requests are dealt round-robin to that many client
    processes (each with rate/procs and conc/procs), so the load generator is not the
    bottleneck."""
    if procs <= 1:
        outs, t0, t1 = asyncio.run(drive(spec))
        return metrics(spec, outs, t1 - t0)
    from radixmesh_bench.client_procs import spread

    outs, wall = spread(procs, spec)
    res = metrics(spec, outs, wall)
    res["client_procs"] = procs
    return res


def metrics(spec: RunSpec, outs: list[Out], wall: float) -> dict[str, Any]:
    ok = [(r, o) for r, o in zip(spec.reqs, outs, strict=True) if o.ok]
    inp = sum(r.prompt_len for r, _ in ok)
    gen = sum(o.output_len for _, o in ok)

    def stats(values: list[float]) -> dict[str, float]:
        ms = [v * 1e3 for v in values]
        if not ms:
            return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
        return {
            "mean": round(sum(ms) / len(ms), 2),
            "p50": round(pct(ms, 50), 2),
            "p90": round(pct(ms, 90), 2),
            "p99": round(pct(ms, 99), 2),
        }

    errors = [o.error for o in outs if not o.ok]
    return {
        "backend": spec.backend,
        "request_rate": "inf" if math.isinf(spec.rate) else spec.rate,
        "max_concurrency": spec.conc or None,
        "completed": len(ok),
        "failed": len(errors),
        "first_error": errors[0] if errors else None,
        "errors_by_kind": dict(Counter(e.split(":", 1)[0] for e in errors)),
        "duration_s": round(wall, 3),
        "total_input_tokens": inp,
        "total_output_tokens": gen,
        "request_throughput": round(len(ok) / wall, 3),
        "input_tok_s": round(inp / wall, 2),
        "output_tok_s": round(gen / wall, 2),
        "ttft_ms": stats([o.ttft for _, o in ok]),
        "itl_ms": stats([x for _, o in ok for x in o.itl]),
        "e2e_ms": stats([o.latency for _, o in ok]),
    }


def flush(http_url: str) -> None:
    """Empty the radix cache (SGLang's /flush_cache), so no run reuses an earlier one's prefills."""
    import urllib.request

    if not http_url:
        return
    req = urllib.request.Request(http_url + "/flush_cache", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        if resp.status != 200:
            raise RuntimeError(f"flush_cache: HTTP {resp.status}")


def plot(runs: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    finite = [r["request_rate"] for r in runs if r["request_rate"] != "inf"]
    inf_x = (max(finite) * 2) if finite else 1.0  # rate inf drawn right of the largest rate
    for k, backend in enumerate(sorted({r["backend"] for r in runs})):
        mine = [r for r in runs if r["backend"] == backend]
        xs = [inf_x if r["request_rate"] == "inf" else r["request_rate"] for r in mine]
        color = f"C{k}"  # one colour per client: p50 solid, p99 dashed
        for ax, key in zip(axes, ("e2e_ms", "ttft_ms"), strict=True):
            ax.plot(xs, [r[key]["p50"] for r in mine], "o-", color=color, label=f"{backend} p50")
            ax.plot(xs, [r[key]["p99"] for r in mine], "x--", color=color, label=f"{backend} p99")
    for ax, title in zip(axes, ("end-to-end latency", "time to first token"), strict=True):
        ax.set_xlabel("request rate (req/s; rightmost = inf)")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def run(ns: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from radixmesh_bench.stack import local_stack_urls
    from services.model_store import resolve_model

    model, model_args = model_source(ns.model, ns.random_weights, ns.device, ns.kv_tokens)
    if ns.random_weights and ns.device.startswith("cuda"):
        model_args += [
            "--attention",
            "flashinfer",
            "--cuda-graph-max-bs",
            str(ns.cuda_graph_max_bs),
        ]
    tok = AutoTokenizer.from_pretrained(model if ns.random_weights else resolve_model(ns.model))
    if ns.dataset == "sharegpt":
        reqs = sharegpt(tok, ns.num_prompts, ns.max_output, ns.max_input)
    else:
        reqs = random_lengths(tok, ns.num_prompts, ns.random_input, ns.random_output, ns.seed)
    rates = [float(x) for x in ns.request_rates.split(",")]
    backends = ns.backends.split(",")
    report: dict[str, Any] = {
        "bench": "serving",
        "model": ns.random_weights or ns.model,
        "device": ns.device if ns.random_weights else "cpu",
        "dataset": ns.dataset,
        "num_prompts": len(reqs),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "runs": [],
    }
    args = ["--radix", "off"] if ns.no_radix else []
    if ns.max_running:
        args += ["--max-running", str(ns.max_running)]
    if ns.chunk_tokens:
        args += ["--chunk-tokens", str(ns.chunk_tokens)]
    report["scheduler_args"] = args
    with local_stack_urls(
        model, model_args=model_args, scheduler_args=args, endpoint=ns.endpoint, http=ns.http
    ) as (
        grpc_ep,
        http_url,
    ):
        run_one(RunSpec("grpc", http_url, grpc_ep, reqs[:2], math.inf, 0, ns.seed))  # warm-up
        for rate in rates:
            for b in backends:  # each rate: the clients back to back on the same requests
                progress(f"{b} at rate {rate} ({len(reqs)} requests)")
                flush(http_url)  # every run starts from an empty radix cache
                spec = RunSpec(b, http_url, grpc_ep, reqs, rate, ns.max_concurrency, ns.seed)
                res = run_one(spec, ns.client_procs)
                report["runs"].append(res)
    by = {(r["backend"], r["request_rate"]): r for r in report["runs"]}
    ratios = {}
    for rate in rates:
        key = "inf" if math.isinf(rate) else rate
        g = by.get(("grpc", key))
        for b in backends:
            h = by.get((b, key))
            if b != "grpc" and g and h and g["output_tok_s"]:
                ratios[f"{b}/grpc@{key}"] = round(h["output_tok_s"] / g["output_tok_s"], 3)
    report["output_tok_s_ratio_vs_grpc"] = ratios
    if ns.plot:
        plot(report["runs"], ns.plot)
        report["plot"] = ns.plot
    return report


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serving", help="online serving over HTTP (and gRPC), bench_serving-style")
    p.add_argument("--model", default="default")
    p.add_argument("--endpoint", default="", help="gRPC endpoint of a running stack")
    p.add_argument("--http", default="", help="HTTP base URL of a running stack")
    p.add_argument("--backends", default="sglang,grpc", help="sglang, openai, grpc (comma list)")
    p.add_argument("--dataset", default="sharegpt", choices=["sharegpt", "random"])
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--max-output", type=int, default=1 << 20, help="cap ShareGPT output lengths")
    p.add_argument("--max-input", type=int, default=1 << 20, help="drop longer ShareGPT prompts")
    p.add_argument("--random-input", type=int, default=256)
    p.add_argument("--random-output", type=int, default=64)
    p.add_argument("--request-rates", default="inf", help="comma list of req/s; inf = all at once")
    p.add_argument("--max-concurrency", type=int, default=0, help="0 = unbounded")
    p.add_argument("--no-radix", action="store_true", help="serve with the radix cache off")
    add_model_flags(p)
    p.add_argument(
        "--max-running", type=int, default=0, help="scheduler --max-running (0: its default)"
    )
    p.add_argument(
        "--chunk-tokens", type=int, default=0, help="scheduler --chunk-tokens (0: default)"
    )
    p.add_argument("--cuda-graph-max-bs", type=int, default=256, help="with --device cuda")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="client processes sharing the requests (so the load generator is no bottleneck)",
    )
    p.add_argument("--plot", default="", help="write a latency-vs-rate PNG here")
    p.add_argument("--out", default="", help="also write the JSON here")

    def main(ns: argparse.Namespace) -> int:
        from radixmesh_bench.report import emit_report

        return emit_report(run(ns), ns.out)

    p.set_defaults(func=main)
