"""`radixmesh bench router`'s measuring side: the /metrics text parser (on a fixed page and on
the scheduler's real metrics), the report math on fixed inputs, the configurations and the
service specs each one starts, the KV split, and the command's --help."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from radixmesh_bench import router
from radixmesh_bench.cli import build_parser
from radixmesh_bench.prom_text import Samples, parse, value
from radixmesh_bench.radix_workloads import Workload
from radixmesh_bench.router_report import (
    CACHED,
    EVICTED,
    FINISHED,
    PROMPT,
    ROUTED,
    Outcome,
    counter_deltas,
    goals,
    hit_rate,
    label_deltas,
    max_over_mean,
    summarize_run,
)
from radixmesh_bench.router_stack import (
    RouterConfig,
    configurations,
    plan,
)
from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.prefix_cache import make_prefix_cache
from scheduler_service.metrics import SchedulerMetrics
from scheduler_service.state import SchedState
from services.launcher import Launcher

ROOT = Path(__file__).resolve().parents[2]

PAGE = """\
# HELP radixmesh_finished_requests_total Requests finished.
# TYPE radixmesh_finished_requests_total counter
radixmesh_finished_requests_total 17.0
# HELP radixmesh_num_queue_reqs Requests waiting for admission.
# TYPE radixmesh_num_queue_reqs gauge
radixmesh_num_queue_reqs 3.0
# HELP radixmesh_routed_requests_total Requests routed.
# TYPE radixmesh_routed_requests_total counter
radixmesh_routed_requests_total{policy="cache_aware",replica="b"} 5.0
radixmesh_routed_requests_total{replica="a",policy="cache_aware"} 2.0
# HELP radixmesh_queue_time_seconds Queue time.
# TYPE radixmesh_queue_time_seconds histogram
radixmesh_queue_time_seconds_bucket{le="0.1"} 4.0
radixmesh_queue_time_seconds_bucket{le="+Inf"} 6.0
radixmesh_queue_time_seconds_count 6.0
radixmesh_queue_time_seconds_sum 1.25
"""


# -- the metrics-text parser -----------------------------------------------------------------
def test_parse_a_fixed_page() -> None:
    s = parse(PAGE)
    assert value(s, FINISHED) == 17.0
    assert value(s, "radixmesh_num_queue_reqs") == 3.0
    # Label order on the page does not matter.
    assert value(s, "radixmesh_routed_requests_total", {"replica": "a", "policy": "cache_aware"})
    assert (
        s[("radixmesh_routed_requests_total", (("policy", "cache_aware"), ("replica", "b")))] == 5
    )
    assert value(s, "radixmesh_queue_time_seconds_bucket", {"le": "+Inf"}) == 6.0
    assert value(s, "radixmesh_queue_time_seconds_sum") == 1.25
    with pytest.raises(KeyError, match="no sample radixmesh_nope"):
        value(s, "radixmesh_nope")


def test_parse_reads_the_schedulers_own_counters() -> None:
    """The sample names the bench diffs are the ones the scheduler really exports."""
    st = SchedState(cache=make_prefix_cache("tree", SlotAllocator(256)), context_length=512)
    st.stats.finished_requests, st.stats.prompt_tokens, st.stats.cached_prompt_tokens = 9, 900, 300
    metrics = SchedulerMetrics(lambda: st, max_running=8)
    s = parse(generate_latest(metrics.registry).decode())
    assert (value(s, FINISHED), value(s, PROMPT), value(s, CACHED)) == (9, 900, 300)


# -- report math -------------------------------------------------------------------------------
def _o(prompt: int, cached: int, lat: float, error: str = "") -> Outcome:
    return Outcome(prompt, cached, 4, lat, lat / 2, error)


def test_hit_rate_counts_only_answered_requests() -> None:
    outs = [_o(100, 50, 1.0), _o(100, 0, 1.0), _o(100, 0, 0.0, "UNAVAILABLE: gone")]
    assert hit_rate(outs) == 0.25
    assert hit_rate([]) == 0.0


def test_max_over_mean() -> None:
    assert max_over_mean([10, 10, 10, 10]) == 1.0
    assert max_over_mean([3, 1]) == 1.5
    assert max_over_mean([8, 0, 0, 0]) == 4.0
    assert max_over_mean([0, 0]) == 0.0 and max_over_mean([]) == 0.0


def _page(finished: float, prompt: float, cached: float) -> dict:
    return {(FINISHED, ()): finished, (PROMPT, ()): prompt, (CACHED, ()): cached}


def test_summarize_run_on_fixed_inputs() -> None:
    before = {"scheduler-1": _page(2, 20, 0), "scheduler-0": _page(2, 20, 0)}
    after = {"scheduler-1": _page(3, 120, 0), "scheduler-0": _page(5, 320, 150)}
    assert counter_deltas(before, after, FINISHED) == {"scheduler-1": 1, "scheduler-0": 3}
    # A scheduler without a model session exports no counters yet: it counted nothing.
    assert counter_deltas({"s": {}}, {"s": _page(4, 0, 0)}, FINISHED) == {"s": 4}
    outs = [_o(100, 50, 1.0), _o(100, 50, 2.0), _o(100, 50, 3.0), _o(100, 0, 4.0)]
    r = summarize_run(outs, 2.0, before, after)
    assert r["requests"] == 4 and r["errors"] == 0
    assert r["hit_rate"] == 0.375 and r["scheduler_hit_rate"] == 0.375
    assert r["requests_per_replica"] == [3, 1]  # in scheduler-name order
    assert r["max_over_mean"] == 1.5
    assert r["output_tokens"] == 16 and r["output_tok_s"] == 8.0
    assert r["latency_p50_s"] == 2.5 and r["latency_p99_s"] == pytest.approx(3.97)
    assert r["ttft_p50_s"] == 1.25
    assert r["evicted_tokens_per_replica"] == [0, 0] and r["route_reasons"] == {}


def test_route_reasons_sum_over_front_doors_and_replicas() -> None:
    def fd(**n: float) -> dict:
        return {
            (ROUTED, (("reason", k.split("_")[0]), ("replica", k.split("_")[1]))): v
            for k, v in n.items()
        }

    before = {"tokenizer-0": fd(cold_a=2), "tokenizer-1": {}}
    after = {"tokenizer-0": fd(cold_a=3, balance_b=1), "tokenizer-1": fd(cold_b=2, balance_a=1)}
    assert label_deltas(before, after, ROUTED, "reason") == {"balance": 2, "cold": 3}
    evicted_before: dict[str, Samples] = {"s0": {(EVICTED, ()): 5.0}, "s1": {}}
    evicted_after: dict[str, Samples] = {"s0": {(EVICTED, ()): 9.0}, "s1": {(EVICTED, ()): 2.0}}
    outs = [_o(100, 0, 1.0)]
    r = summarize_run(outs, 1.0, evicted_before, evicted_after, before, after)
    assert r["evicted_tokens_per_replica"] == [4, 2]
    assert r["route_reasons"] == {"balance": 2, "cold": 3}


def _run(cfg: RouterConfig, hit: float, mom: float = 1.0) -> dict:
    return {
        "config": cfg.label,
        "replicas": cfg.replicas,
        "router": cfg.router,
        "front_doors": cfg.front_doors,
        "hit_rate": hit,
        "max_over_mean": mom,
    }


def test_goals_on_fixed_runs() -> None:
    single, ca4 = RouterConfig(1, "single"), RouterConfig(4, "cache_aware")
    rr4 = RouterConfig(4, "round_robin")
    ca2fd = RouterConfig(4, "cache_aware", 2)
    w = {
        "gsp": {"runs": [_run(single, 0.8), _run(ca4, 0.78), _run(rr4, 0.3), _run(ca2fd, 0.7)]},
        "chat": {"runs": [_run(single, 0.0), _run(ca4, 0.1)]},
        "few_shot": {"runs": [_run(ca4, 0.9)]},  # no baseline: left out
        "uniform": {"runs": [_run(single, 0, 1.0), _run(ca4, 0, 1.2), _run(rr4, 0, 1.3)]},
        "skewed": {"runs": [_run(ca4, 0.5, 3.2)]},
    }
    g = goals(w)
    vs_single = {
        (x["workload"], x["config"]): (x["ratio"], x["pass"]) for x in g["cache_aware_vs_single"]
    }
    assert vs_single == {
        ("gsp", "4 replicas cache_aware"): (0.975, True),
        ("gsp", "4 replicas cache_aware, 2 front doors"): (0.875, False),
        ("chat", "4 replicas cache_aware"): (None, None),  # a zero baseline
    }
    assert g["cache_aware_vs_round_robin_gsp"] == [{"replicas": 4, "ratio": 2.6, "pass": True}]
    assert [(x["config"], x["pass"]) for x in g["uniform_max_over_mean"]] == [
        ("4 replicas cache_aware", True),
        ("4 replicas round_robin", False),
    ]
    assert [x["pass"] for x in g["skewed_max_over_mean"]] == [False]
    # round_robin at 0 %: any cache_aware hit is a pass (the ratio is undefined).
    w["gsp"]["runs"][2]["hit_rate"] = 0.0
    assert goals(w)["cache_aware_vs_round_robin_gsp"][0] == {
        "replicas": 4,
        "ratio": None,
        "pass": True,
    }


def test_goals_skip_failed_runs() -> None:
    single, ca2 = RouterConfig(1, "single"), RouterConfig(2, "cache_aware")
    failed = {"config": ca2.label, "replicas": 2, "router": "cache_aware", "error": "no"}
    w = {"gsp": {"runs": [_run(single, 0.5), failed]}, "uniform": {"runs": [failed]}}
    assert all(v == [] for v in goals(w).values())


# -- configurations and topologies -------------------------------------------------------------
def test_configurations() -> None:
    cfgs = configurations([1, 2, 4], ["cache_aware", "round_robin", "least_load"], 2, 4)
    assert [c.label for c in cfgs] == [
        "1 replica",
        "2 replicas cache_aware",
        "2 replicas round_robin",
        "2 replicas least_load",
        "4 replicas cache_aware",
        "4 replicas round_robin",
        "4 replicas least_load",
        "4 replicas cache_aware, 2 front doors",
    ]
    assert configurations([1], ["cache_aware"], 0, 0) == [RouterConfig(1, "single")]
    with pytest.raises(ValueError, match="unknown router 'random'"):
        configurations([2], ["random"], 0, 0)
    with pytest.raises(ValueError, match="at least 2 replicas"):
        configurations([1], ["cache_aware"], 2, 1)


def test_plan_splits_the_kv_and_wires_every_front_door_to_every_replica() -> None:
    numbers = iter(range(20000, 20100))
    specs, running = plan(
        RouterConfig(2, "round_robin", 2),
        "m",
        ["--device", "cpu"],
        1001,
        ["--radix", "tree"],
        port=lambda _: next(numbers),
    )
    by = {s.name: s for s in specs}
    assert sorted(by) == [
        "grammar",
        "model-0",
        "model-1",
        "scheduler-0",
        "scheduler-1",
        "tokenizer-0",
        "tokenizer-1",
    ]
    for m in ("model-0", "model-1"):
        assert by[m].args[by[m].args.index("--kv-tokens") + 1] == "500"  # 1001 // 2
    scheds = f"--scheduler-address={by['scheduler-0'].address},{by['scheduler-1'].address}"
    for fd in ("tokenizer-0", "tokenizer-1"):
        a = by[fd].args
        assert scheds in a and a[a.index("--router") + 1] == "round_robin"
    assert all(any(x.startswith("--metrics-port=") for x in s.args) for s in specs)
    assert running.endpoints == [by["tokenizer-0"].address, by["tokenizer-1"].address]
    flag = next(x for x in by["scheduler-1"].args if x.startswith("--metrics-port="))
    metrics_port = flag.split("=")[1]
    assert running.scheduler_metrics["scheduler-1"] == f"http://127.0.0.1:{metrics_port}/metrics"
    # One replica: nothing to route, so no --router (a front door without the flag runs it).
    single, _ = plan(RouterConfig(1, "single"), "m", [], 640, [])
    one = {s.name: s for s in single}
    assert "--router" not in one["tokenizer"].args
    margs = one["model"].args
    assert margs[margs.index("--kv-tokens") + 1] == "640"


def test_every_service_gets_its_roles_certificate() -> None:
    """Services authorize peers by role: a second scheduler's certificate must say
    "scheduler", or the model and grammar services refuse it (PERMISSION_DENIED)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    specs, _ = plan(RouterConfig(2, "cache_aware", 2), "m", [], 1000, [])
    launcher = Launcher(specs, internal_tls=True)
    try:
        for name in ("scheduler-1", "model-0", "tokenizer-1", "grammar", "launcher"):
            files = launcher._service_env(name) if name != "launcher" else None
            path = files["RADIXMESH_MTLS_CERT"] if files else str(launcher.pki["launcher"].cert)
            cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
            cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
            assert cn == name.split("-")[0]
        assert launcher.probe_tls("model-1") == launcher.pki["launcher"]
    finally:
        launcher.stop_all()
    assert launcher.pki_dir is not None and not launcher.pki_dir.exists()


def test_kv_total_is_shared_and_never_too_small() -> None:
    w = Workload("x", 4, prompts=[[1] * 100, [1] * 50 + [2] * 50])
    # unique: 100 + 4 (outputs) + 50 + 4 = 158; floor for 4 replicas: 4 * (104 + 64) = 672
    assert router.kv_total(w, 1.0, 1, 0) == 168
    assert router.kv_total(w, 1.0, 4, 0) == 672
    assert router.kv_total(w, 10.0, 4, 0) == 1580
    assert router.kv_total(w, 1.0, 4, 5000) == 5000
    with pytest.raises(ValueError, match="--kv-tokens 600 is too small for x"):
        router.kv_total(w, 1.0, 4, 600)


# -- the command -------------------------------------------------------------------------------
def test_size_flags_override_the_scale() -> None:
    ns = build_parser().parse_args(["router", "--scale", "small", "--gsp-groups", "3"])
    assert isinstance(ns, argparse.Namespace) and ns.func is not None
    assert ns.gsp_groups == 3 and ns.skewed_hot_fraction is None
    ns = build_parser().parse_args(["router", "--skewed-hot-fraction", "0.5"])
    assert ns.skewed_hot_fraction == 0.5 and ns.replicas == "1,2,4"


@pytest.mark.integration  # starts a process
def test_help_through_the_radixmesh_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", "bench", "router", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=True,
    ).stdout
    for flag in ("--replicas", "--routers", "--kv-tokens", "--random-weights", "--gsp-groups"):
        assert flag in out
