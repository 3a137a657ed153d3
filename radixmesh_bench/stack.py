"""Start a local stack for a benchmark (or use a running one) and measure requests on it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixmesh.api import Client, GenerateResult

from services.launcher import Launcher, StackPorts, stack_specs
from services.logging import configure_logging


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def local_stack(
    model: str = "default",
    model_args: Sequence[str] = (),
    scheduler_args: Sequence[str] = (),
    endpoint: str = "",
) -> Iterator[str]:
    """Yields an API endpoint: `endpoint` if given, else a fresh stack on free ports."""
    with local_stack_urls(model, model_args, scheduler_args, endpoint) as (grpc_ep, _):
        yield grpc_ep


def model_source(
    model: str, random_weights: str = "", device: str = "cuda", kv_tokens: int = 0
) -> tuple[str, list[str]]:
    """The model folder and the model service's flags: `model` (the embedded default, a
    folder or a hub id), or random weights of a published shape (`random_weights=
    "llama-3.1-8b"`, on `device`) for GPU runs."""
    kv = ["--kv-tokens", str(kv_tokens)] if kv_tokens else []
    if not random_weights:
        return model, kv
    from model_service.random_configs import random_config

    _, folder = random_config(random_weights)
    return str(folder), ["--random-weights", random_weights, "--device", device, *kv]


def add_model_flags(p: argparse.ArgumentParser, kv_help: str = "KV pool size (0: budget)") -> None:
    """The flags `model_source` reads, shared by the benches that run on the GPU too."""
    p.add_argument("--random-weights", default="", help="a random model shape, e.g. llama-3.1-8b")
    p.add_argument("--device", default="cuda", help="with --random-weights")
    p.add_argument("--kv-tokens", type=int, default=0, help=kv_help)


@contextlib.contextmanager
def local_stack_urls(
    model: str = "default",
    model_args: Sequence[str] = (),
    scheduler_args: Sequence[str] = (),
    endpoint: str = "",
    http: str = "",
) -> Iterator[tuple[str, str]]:
    """Yields (gRPC endpoint, HTTP base URL): the given ones if `endpoint` is set, else those
    of a fresh stack on free ports."""
    if endpoint:
        yield endpoint, http
        return
    configure_logging("bench", "warning")  # stdout carries only the JSON report
    ports = StackPorts.free()
    logs = Path(tempfile.mkdtemp(prefix="radixmesh-bench-"))
    launcher = Launcher(
        stack_specs(ports, model, model_args=list(model_args), scheduler_args=list(scheduler_args)),
        log_dir=logs,
    )
    progress(f"starting stack (logs in {logs}) {' '.join(scheduler_args)}")
    launcher.start_all()
    try:
        asyncio.run(launcher.wait_ready(timeout=600))
        yield f"127.0.0.1:{ports.tokenizer}", f"http://127.0.0.1:{ports.http}"
    finally:
        launcher.stop_all()


@dataclass
class Timed:
    result: GenerateResult
    ttft_s: float
    latency_s: float


def timed_stream(c: Client, **kw: object) -> Timed:
    t0 = time.perf_counter()
    first = None
    final = None
    for item in c.stream(**kw):  # type: ignore[arg-type]
        if first is None:
            first = time.perf_counter() - t0
        if isinstance(item, GenerateResult):
            final = item
    assert final is not None
    return Timed(final, first or 0.0, time.perf_counter() - t0)


def run_concurrent(
    endpoint: str, requests: Sequence[dict], concurrency: int
) -> tuple[list[Timed], float]:
    with Client(endpoint) as c, ThreadPoolExecutor(concurrency) as pool:
        t0 = time.perf_counter()
        out = list(pool.map(lambda kw: timed_stream(c, **kw), requests))
        return out, time.perf_counter() - t0


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def summarize(timed: Sequence[Timed], wall_s: float) -> dict[str, float]:
    toks = sum(t.result.completion_tokens for t in timed)
    ttfts = [t.ttft_s * 1e3 for t in timed]
    return {
        "requests": len(timed),
        "output_tokens": toks,
        "wall_s": round(wall_s, 3),
        "output_tok_s": round(toks / wall_s, 2),
        "ttft_ms_p50": round(pct(ttfts, 50), 1),
        "ttft_ms_p99": round(pct(ttfts, 99), 1),
    }


def emit_report(report: dict[str, Any], out: str = "") -> int:
    """Print a bench's JSON report on stdout (and to `out` if given); the command's exit code."""
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        Path(out).write_text(text)
    return 0
