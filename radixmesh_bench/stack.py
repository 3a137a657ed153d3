"""The one way the benchmarks start services, and measuring requests on a stack.

`running(launcher)` starts a launcher's services, waits until every one is ready and stops them
all on the way out; every bench goes through it: `local_stack` / `local_stack_urls` (the CPU
benches, or a running stack's endpoint), `bench router`'s topologies (router_stack.py), the GPU
parts `stack` (gpu/stack.py) and sharegpt/gsp/mmlu (gpu/serving_stack.py). `random_model_args`
is the model service the GPU stacks share: random weights of a published shape."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from radixmesh.api import Client, GenerateResult

from services.launcher import Launcher, ServiceSpec, StackPorts, check_ready, stack_specs
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
    specs = stack_specs(
        ports, model, model_args=list(model_args), scheduler_args=list(scheduler_args)
    )
    progress(f"starting stack (logs in {logs}) {' '.join(scheduler_args)}")
    with running(launcher_for(specs, logs), timeout=600):
        yield f"127.0.0.1:{ports.tokenizer}", f"http://127.0.0.1:{ports.http}"


def launcher_for(
    specs: Sequence[ServiceSpec],
    log_dir: Path,
    env: dict[str, str] | None = None,
    internal_tls: bool = False,
) -> Launcher:
    """A launcher for `specs`, every service's output in `log_dir`."""
    return Launcher(list(specs), log_dir=log_dir, env=env, internal_tls=internal_tls)


@contextlib.contextmanager
def running(launcher: Launcher, timeout: float = 600.0) -> Iterator[Launcher]:
    """Start every service of `launcher`, wait until all are ready (at most `timeout` s), yield;
    stop them all on the way out, also when the start-up fails."""
    launcher.start_all()
    try:
        asyncio.run(launcher.wait_ready(timeout=timeout))
        yield launcher
    finally:
        launcher.stop_all()


def restart_scheduler(
    launcher: Launcher, args: Sequence[str], timeout: float = 120.0, stop_wait_s: float = 30.0
) -> None:
    """A new scheduler process with flags `args` (an empty cache, zero counters) beside the same
    model, grammar and front-door processes (weights stay loaded). The old one gets SIGTERM and,
    still there after `stop_wait_s`, SIGKILL. Waits until the front door has seen it go (at most
    10 s: else it could report ready on the stale connection), then until the new one and the
    front door are ready."""
    launcher.specs["scheduler"].args = list(args)
    proc = launcher.procs["scheduler"]
    proc.terminate()
    try:
        proc.wait(stop_wait_s)
    except subprocess.TimeoutExpired:
        # Its shutdown grace (--shutdown-grace-s, 35 s) waits for the front door's session,
        # which stays open; nothing is in flight between runs, so end it as stop_all does.
        proc.kill()
        proc.wait()
    front = launcher.specs["tokenizer"].address

    async def again() -> None:
        deadline = time.monotonic() + 10
        while await check_ready(front) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        launcher.start("scheduler")
        await launcher.wait_ready(timeout=timeout, names=["scheduler", "tokenizer"])

    asyncio.run(again())


def random_model_args(model: str, device: str, graph_max_bs: int) -> tuple[Path, list[str]]:
    """The GPU stacks' model service: random weights of `model`'s published shape on `device`,
    flashinfer on CUDA (the reference attention elsewhere), decode batches up to `graph_max_bs`
    replayed from CUDA graphs. Also the model's folder (config.json and tokenizer), which the
    other services read."""
    from model_service.random_configs import random_config

    _, model_dir = random_config(model)
    attention = "flashinfer" if device.startswith("cuda") else "reference"
    args = ["--random-weights", model, "--device", device, "--attention", attention]
    return Path(model_dir), [*args, "--cuda-graph-max-bs", str(graph_max_bs)]


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
