"""`radixmesh bench security`: what TLS and API keys cost (JSON on stdout).

Two stacks run side by side on the same model: `plain` (every link plaintext, no keys) and
`secured` (mutual TLS on every internal link, TLS on the public port, an API key on every
call). The same workload runs on each in alternating rounds (A B A B ...), so drift on the
machine hits both alike; the report gives output tok/s and latency percentiles per mode and
the secured/plain ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from radixmesh_bench.report import emit_report
from radixmesh_bench.stack import add_model_flags, launcher_for, model_source, progress, running
from services.launcher import StackPorts, free_port, stack_specs
from services.logging import configure_logging
from services.pki import make_server_cert

API_KEY = "bench-key"


def _model(ns: argparse.Namespace) -> tuple[str, list[str]]:
    return model_source(ns.model, ns.random_weights, ns.device, ns.kv_tokens)


@contextlib.contextmanager
def _stack(
    secured: bool, model: str, model_args: list[str], sched_args: list[str], logs: Path
) -> Iterator[dict[str, Any]]:
    ports = StackPorts.free()
    tok_args: list[str] = []
    client: dict[str, Any] = {"endpoint": f"127.0.0.1:{ports.tokenizer}"}
    if secured:
        ca, cert, key = make_server_cert(logs / "public-tls", "localhost")
        tok_args = ["--api-keys", API_KEY, "--tls-cert", str(cert), "--tls-key", str(key)]
        client = {"endpoint": f"localhost:{ports.tokenizer}", "api_key": API_KEY, "tls": str(ca)}
    specs = stack_specs(
        ports, model, model_args=model_args, scheduler_args=sched_args, tokenizer_args=tok_args
    )
    if secured:
        next(s for s in specs if s.name == "tokenizer").health_port = free_port()
    launcher = launcher_for(specs, logs / ("secured" if secured else "plain"), internal_tls=secured)
    with running(launcher, timeout=600):
        yield client


def _round(client: dict[str, Any], n: int, concurrency: int, tokens: int) -> dict[str, Any]:
    """One round: `n` streams, `concurrency` at a time, through one asyncio client (threads
    would make the client's GIL, not the server, the thing measured)."""
    return asyncio.run(_round_async(client, n, concurrency, tokens))


async def _round_async(
    client: dict[str, Any], n: int, concurrency: int, tokens: int
) -> dict[str, Any]:
    from radixmesh.api import AsyncClient, Chunk, GenerateResult

    sem = asyncio.Semaphore(concurrency)

    async def one(c: AsyncClient, i: int) -> tuple[int, float, float]:
        async with sem:
            t0 = time.perf_counter()
            first, done = 0.0, 0
            async for item in c.stream(
                f"Request {i}: write a short story about the number {i}.",
                max_new_tokens=tokens,
                ignore_eos=True,
                temperature=0.0,
            ):
                if isinstance(item, Chunk) and item.token_ids and not first:
                    first = time.perf_counter() - t0
                elif isinstance(item, GenerateResult):
                    done = item.completion_tokens
            return done, first, time.perf_counter() - t0

    async with AsyncClient(timeout=600, **client) as c:
        t0 = time.perf_counter()
        out = await asyncio.gather(*(one(c, i) for i in range(n)))
        wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "out_tokens": sum(o[0] for o in out),
        "latency_s": [o[2] for o in out],
        "ttft_s": [o[1] for o in out],
    }


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    lat = sorted(x for r in rounds for x in r["latency_s"])
    ttft = sorted(x for r in rounds for x in r["ttft_s"])
    tok_s = [r["out_tokens"] / r["wall_s"] for r in rounds]
    return {
        "output_tok_s_median": statistics.median(tok_s),
        "output_tok_s_rounds": [round(x, 1) for x in tok_s],
        "latency_p50_s": statistics.median(lat),
        "latency_p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "ttft_p50_s": statistics.median(ttft),
    }


def run(ns: argparse.Namespace) -> dict[str, Any]:
    configure_logging("bench", "warning")
    logs = Path(tempfile.mkdtemp(prefix="radixmesh-bench-security-"))
    results: dict[str, list[dict[str, Any]]] = {"plain": [], "secured": []}
    model, model_args = _model(ns)
    sched_args = ["--max-running", str(ns.max_running)] if ns.max_running else []
    with (
        _stack(False, model, model_args, sched_args, logs) as plain,
        _stack(True, model, model_args, sched_args, logs) as secured,
    ):
        # Warm both with the full workload (first-call costs, kernel caches, clocks), then
        # measure in ABBA order: plain-secured, secured-plain, ... so a trend within a pair
        # favours neither mode.
        warm: dict[str, list[float]] = {"plain": [], "secured": []}
        for i in range(ns.warmup_rounds):
            for name, client in (("plain", plain), ("secured", secured)):
                progress(f"warm-up {i + 1}/{ns.warmup_rounds}: {name}")
                r = _round(client, ns.requests, ns.concurrency, ns.max_new_tokens)
                warm[name].append(round(r["out_tokens"] / r["wall_s"], 1))
        for i in range(ns.rounds):
            pair = [("plain", plain), ("secured", secured)]
            for name, client in pair if i % 2 == 0 else pair[::-1]:
                progress(f"round {i + 1}/{ns.rounds}: {name}")
                results[name].append(_round(client, ns.requests, ns.concurrency, ns.max_new_tokens))
    plain_s, sec_s = _summary(results["plain"]), _summary(results["secured"])
    return {
        "bench": "security",
        "workload": {
            "requests_per_round": ns.requests,
            "concurrency": ns.concurrency,
            "max_new_tokens": ns.max_new_tokens,
            "rounds": ns.rounds,
            "warmup_rounds": ns.warmup_rounds,
            "order": "ABBA",
            "model": ns.random_weights or ns.model,
            "device": ns.device if ns.random_weights else "cpu",
        },
        "warmup_output_tok_s": warm,
        "plain": plain_s,
        "secured": sec_s,
        "throughput_ratio": sec_s["output_tok_s_median"] / plain_s["output_tok_s_median"],
        # Each round's secured run against the plain run beside it: drift between rounds
        # (clocks, caches) cancels out.
        "throughput_ratio_paired_median": statistics.median(
            (s["out_tokens"] / s["wall_s"]) / (p["out_tokens"] / p["wall_s"])
            for p, s in zip(results["plain"], results["secured"], strict=True)
        ),
        "latency_p50_ratio": sec_s["latency_p50_s"] / plain_s["latency_p50_s"],
        "logs": str(logs),
    }


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("security", help="throughput and latency with and without TLS + keys")
    p.add_argument("--model", default="default")
    p.add_argument("--requests", type=int, default=32, help="requests per round")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup-rounds", type=int, default=1, help="unmeasured full rounds each")
    add_model_flags(p, kv_help="KV pool per stack (two share a GPU)")
    p.add_argument(
        "--max-running", type=int, default=0, help="scheduler --max-running (0: its default)"
    )

    def main(ns: argparse.Namespace) -> int:
        return emit_report(run(ns))

    p.set_defaults(func=main)
