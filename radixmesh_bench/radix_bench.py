"""`radixmesh bench radix`: RadixAttention on four workloads built from real text
(radix_workloads.py).

Workloads ``multi_turn_long`` and ``host_burst`` (radix_host_tier.py) compare the host KV
tier off, write-back and write-through.

Per workload: a KV pool of ~40 % of the workload's unique tokens (``--kv-tokens``), and runs with
``--radix tree`` / ``off`` / ``table`` and ``--policy lpm`` / ``fcfs`` / ``random``. Every
request of a workload is submitted at once (chat: every session at once, turns in order), so
they queue in the scheduler and the policy chooses. Each run gets a fresh scheduler process
(cold cache) on the same model process. Reported per run: throughput, achieved hit rate
(GetStats), achieved/optimal against the workload's offline optimum, radix bookkeeping per step
and as a fraction of wall time.

    radixmesh bench radix [--quick] [--out FILE]     # JSON on stdout, progress on stderr
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from radixmesh.api import Client, GenerateResult

from radixmesh_bench.radix_host_tier import BURST, NAME, run_host_burst, run_host_tier
from radixmesh_bench.radix_workloads import (
    Workload,
    build_workloads,
    optimal_hit_rate,
    unique_tokens,
)
from radixmesh_bench.stack import launcher_for, progress, restart_scheduler, running
from services.launcher import StackPorts, stack_specs


# -- the stack -------------------------------------------------------------------------------------
class BenchStack:
    """One model process (KV sized per workload) and a fresh scheduler process per run."""

    def __init__(
        self,
        kv_tokens: int,
        log_dir: Path,
        model: str = "default",
        host_kv_tokens: int = 0,
        metrics: bool = False,
    ) -> None:
        self.ports = StackPorts.free()
        model_args = ["--kv-tokens", str(kv_tokens)]
        if host_kv_tokens:  # the model service's host KV pool (issue 31)
            model_args += ["--host-kv-tokens", str(host_kv_tokens)]
        self.metrics = StackPorts.free() if metrics else None  # each service's /metrics port
        specs = stack_specs(self.ports, model, model_args=model_args, metrics=self.metrics)
        self.launcher = launcher_for(specs, log_dir)
        self._running = contextlib.ExitStack()  # holds the stack while it runs
        self.base_args = list(self.launcher.specs["scheduler"].args)
        self.endpoint = f"127.0.0.1:{self.ports.tokenizer}"
        self.started = False

    def use_scheduler(self, args: Sequence[str]) -> None:
        """Start the stack with scheduler flags `args`, or restart only the scheduler with them
        (radixmesh_bench.stack: the benches' one starter)."""
        if not self.started:
            self.launcher.specs["scheduler"].args = [*self.base_args, *args]
            self._running.enter_context(running(self.launcher, timeout=600))
            self.started = True
            return
        restart_scheduler(self.launcher, [*self.base_args, *args], timeout=120, stop_wait_s=5)

    def metrics_port(self, name: str) -> int:
        assert self.metrics is not None, "a BenchStack(metrics=True) serves /metrics"
        return int(getattr(self.metrics, name))

    def stop(self) -> None:
        self._running.close()
        self.started = False


# -- running ---------------------------------------------------------------------------------
def _gen(c: Client, ids: list[int], max_new: int) -> GenerateResult:
    return c.generate(input_ids=ids, max_new_tokens=max_new, temperature=0, ignore_eos=True)


def run_workload(
    endpoint: str, w: Workload, concurrency: int
) -> tuple[list[list[int]], list[list[int]], int, float]:
    """Submit every request (chat: every session) at once. Returns (prompts, what each left in
    the KV cache, output tokens, wall seconds)."""
    prompts: list[list[int]] = []
    computed: list[list[int]] = []
    out_tokens = 0
    with Client(endpoint) as c:
        t0 = time.perf_counter()
        if not w.is_chat:
            with ThreadPoolExecutor(min(concurrency, len(w.prompts))) as pool:
                results = list(pool.map(lambda p: _gen(c, p, w.max_new), w.prompts))
            for p, r in zip(w.prompts, results, strict=True):
                prompts.append(p)
                computed.append(p + r.output_ids[:-1])
                out_tokens += r.completion_tokens
        else:

            def session(
                first: list[int], followups: list[list[int]]
            ) -> list[tuple[list[int], list[int]]]:
                done, p = [], list(first)
                for k in range(len(followups) + 1):
                    r = _gen(c, p, w.max_new)
                    done.append((p, r.output_ids))
                    if k < len(followups):
                        p = p + r.output_ids + followups[k]
                return done

            with ThreadPoolExecutor(min(concurrency, len(w.sessions))) as pool:
                turns = list(pool.map(lambda s: session(*s), w.sessions))
            for sess in turns:
                for p, out in sess:
                    prompts.append(p)
                    computed.append(p + out[:-1])
                    out_tokens += len(out)
        wall = time.perf_counter() - t0
    return prompts, computed, out_tokens, wall


@dataclass(frozen=True)
class RunConfig:
    """One scheduler configuration; ``eviction``/``protect_ms`` empty: the scheduler default."""

    radix: str
    policy: str = "lpm"
    eviction: str = ""
    protect_ms: str = ""

    def args(self) -> list[str]:
        out = ["--radix", self.radix, "--policy", self.policy]
        if self.eviction:
            out += ["--eviction", self.eviction]
        if self.protect_ms:
            out += ["--protect-ms", self.protect_ms]
        return out


def parse_configs(specs: Sequence[str]) -> list[RunConfig]:
    """``RADIX[:POLICY[:EVICTION[:PROTECT_MS]]]``, e.g. ``tree:lpm:lfu:0``, ``off``."""
    out = []
    for spec in specs:
        parts = spec.split(":")
        if not 1 <= len(parts) <= 4:
            raise ValueError(f"bad config {spec!r}")
        parts += [""] * (4 - len(parts))
        out.append(RunConfig(parts[0], parts[1] or "lpm", parts[2], parts[3]))
    return out


CONFIGS = parse_configs(["tree:lpm", "off", "table", "tree:fcfs", "tree:random"])
QUICK_CONFIGS = parse_configs(["tree:lpm", "off", "tree:fcfs"])


def run_config(
    stack: BenchStack, w: Workload, cfg: RunConfig, concurrency: int, extra: Sequence[str]
) -> dict:
    stack.use_scheduler([*cfg.args(), *extra])
    with Client(stack.endpoint) as c:
        _gen(c, [1, 2, 3, 4], 1)  # warm-up through the new scheduler (excluded by deltas)
        s0 = c.stats()
        prompts, computed, out_tokens, wall = run_workload(stack.endpoint, w, concurrency)
        s1 = c.stats()
    opt = optimal_hit_rate(prompts, computed)
    dp = s1.prompt_tokens - s0.prompt_tokens
    dc = s1.cached_prompt_tokens - s0.cached_prompt_tokens
    steps = s1.steps - s0.steps
    radix_s = s1.radix_seconds - s0.radix_seconds
    hit = dc / dp if dp else 0.0
    return {
        "radix": cfg.radix,
        "policy": cfg.policy,
        "eviction": cfg.eviction or "default",
        "protect_ms": cfg.protect_ms or "default",
        "requests": len(prompts),
        "wall_s": round(wall, 2),
        "output_tokens": out_tokens,
        "output_tok_s": round(out_tokens / wall, 2),
        "prompt_tokens": dp,
        "cached_prompt_tokens": dc,
        "hit_rate": round(hit, 4),
        "optimal_hit_rate": round(opt["optimal_hit_rate"], 4),
        "achieved_over_optimal": round(hit / opt["optimal_hit_rate"], 4)
        if opt["optimal_hit_rate"]
        else None,
        "evicted_tokens": s1.evicted_tokens - s0.evicted_tokens,
        "retractions": s1.retractions - s0.retractions,
        "steps": steps,
        "radix_ms_per_step": round(1e3 * radix_s / steps, 4) if steps else 0.0,
        "radix_fraction_of_wall": round(radix_s / wall, 6),
    }


def run(ns: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from services.model_store import resolve_model

    folder = resolve_model(ns.model)
    tok = AutoTokenizer.from_pretrained(folder)

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False))

    workloads = build_workloads(encode, quick=ns.quick, max_new=ns.max_new)
    if ns.only:
        workloads = [w for w in workloads if w.name in ns.only]
    configs = parse_configs(ns.configs) if ns.configs else QUICK_CONFIGS if ns.quick else CONFIGS
    report: dict = {
        "bench": "radix_workloads",
        "model": folder.name,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": {
            "max_new_tokens": ns.max_new,
            "kv_fraction": ns.kv_fraction,
            "concurrency": ns.concurrency,
            "quick": ns.quick,
        },
        "workloads": {},
    }
    t_all = time.perf_counter()
    for w in workloads:
        prompts, full = w.planned()
        unique = unique_tokens(full)
        longest = max(len(f) for f in full)
        kv = max(int(unique * ns.kv_fraction), longest + 16)
        plan = optimal_hit_rate(prompts, [f[:-1] for f in full])
        entry: dict = {
            "requests": len(prompts),
            "prompt_tokens": plan["prompt_tokens"],
            "unique_tokens": unique,
            "kv_tokens": kv,
            "kv_fraction": round(kv / unique, 3),
            "optimal_hit_rate_planned": round(plan["optimal_hit_rate"], 4),
            "runs": [],
        }
        progress(
            f"{w.name}: {len(prompts)} requests, {plan['prompt_tokens']} prompt tokens, "
            f"{unique} unique, KV {kv} tokens, optimal {plan['optimal_hit_rate']:.3f}"
        )
        stack = BenchStack(kv, Path(tempfile.mkdtemp(prefix=f"radix-bench-{w.name}-")), ns.model)
        try:
            for cfg in configs:
                progress(f"  {w.name}: {' '.join(cfg.args())}")
                r = run_config(stack, w, cfg, ns.concurrency, ns.sched_arg)
                progress(
                    f"    hit {r['hit_rate']:.3f} (optimal {r['optimal_hit_rate']:.3f}), "
                    f"{r['output_tok_s']} tok/s, {r['wall_s']} s"
                )
                entry["runs"].append(r)
        finally:
            stack.stop()
        report["workloads"][w.name] = entry
    for name, host_run in ((NAME, run_host_tier), (BURST, run_host_burst)):
        if not ns.only or name in ns.only:
            report["workloads"][name] = host_run(
                encode,
                quick=ns.quick,
                max_new=ns.max_new,
                concurrency=ns.host_tier_concurrency,
                model=ns.model,
            )
    report["total_s"] = round(time.perf_counter() - t_all, 1)
    return report


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("radix", help="radix cache: hit rate vs optimal, policies, overhead")
    p.add_argument("--model", default="default")
    p.add_argument("--quick", action="store_true", help="smaller workloads, 3 configurations")
    p.add_argument("--max-new", type=int, default=8, help="output tokens per request")
    p.add_argument(
        "--kv-fraction",
        type=float,
        default=0.4,
        help="KV capacity as a fraction of the workload's unique tokens",
    )
    p.add_argument("--concurrency", type=int, default=64, help="most requests in flight")
    p.add_argument(
        "--host-tier-concurrency",
        type=int,
        default=4,
        help=f"{NAME} and {BURST} (host KV tier off, write-back, write-through): "
        "conversations in flight at once",
    )
    p.add_argument("--only", nargs="*", default=[], help="workload names to run")
    p.add_argument(
        "--configs",
        nargs="*",
        default=[],
        help="RADIX[:POLICY[:EVICTION[:PROTECT_MS]]] runs instead of the default set "
        "(e.g. tree:lpm off tree:lpm:lfu:0; omitted parts: lpm and the scheduler defaults)",
    )
    p.add_argument(
        "--sched-arg",
        action="append",
        default=[],
        help="extra scheduler flag for every run (repeatable)",
    )
    p.add_argument("--out", default="", help="also write the JSON here")

    def main(ns: argparse.Namespace) -> int:
        from radixmesh_bench.report import emit_report

        return emit_report(run(ns), ns.out)

    p.set_defaults(func=main)
