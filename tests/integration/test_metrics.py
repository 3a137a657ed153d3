"""/metrics on every service of the shared stack: the Prometheus text parses, the documented
names exist with their types, counters move by exactly what a request did, and every name the
Grafana dashboard and the HPA's adapter rule query is stored under that name by a real
Prometheus (2.x and 3.x Accept headers; promtool's lint when it is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from radixmesh.api import Client

from tests.conftest import Stack

pytestmark = pytest.mark.integration

# family name (as the parser reports it: counters without `_total`) -> type, per service
EXPECTED = {
    "tokenizer": {
        "radixmesh_frontdoor_inflight_streams": "gauge",
        "radixmesh_num_requests": "counter",
        "radixmesh_request_success": "counter",
        "radixmesh_request_failure": "counter",
        "radixmesh_frontdoor_generation_tokens": "counter",
        "radixmesh_time_to_first_token_seconds": "histogram",
        "radixmesh_inter_token_latency_seconds": "histogram",
        "radixmesh_frontdoor_token_hold_seconds": "histogram",
        "radixmesh_e2e_request_latency_seconds": "histogram",
        "radixmesh_router_replica_connected": "gauge",
        "radixmesh_router_replica_load_tokens": "gauge",
        "radixmesh_router_replica_load_requests": "gauge",
    },
    "scheduler": {
        "radixmesh_num_running_reqs": "gauge",
        "radixmesh_num_queue_reqs": "gauge",
        "radixmesh_token_usage": "gauge",
        "radixmesh_cache_hit_rate": "gauge",
        "radixmesh_cache_blocks": "gauge",
        "radixmesh_prompt_tokens": "counter",
        "radixmesh_generation_tokens": "counter",
        "radixmesh_queue_time_seconds": "histogram",
        "radixmesh_scheduler_step_seconds": "histogram",
        "radixmesh_scheduler_batch_size": "histogram",
    },
    "model": {
        "radixmesh_model_forward_seconds": "histogram",
        "radixmesh_model_batch_size": "histogram",
        "radixmesh_kv_pool_tokens": "gauge",
        "radixmesh_model_steps": "counter",
    },
    "grammar": {
        "radixmesh_grammar_cache_hits": "counter",
        "radixmesh_grammar_cache_misses": "counter",
        "radixmesh_grammar_compile_seconds": "histogram",
        "radixmesh_grammar_mask_seconds": "histogram",
    },
}


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of http://127.0.0.1:port/metrics, keyed by (name, sorted labels); also
    checks the family types against EXPECTED for the service on that port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        out[("__type__:" + fam.name, ())] = float(["counter", "gauge", "histogram"].index(fam.type))
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _type(samples: dict, family: str) -> str | None:
    v = samples.get(("__type__:" + family, ()))
    return None if v is None else ["counter", "gauge", "histogram"][int(v)]


def _get(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_every_service_serves_metrics_that_move(stack: Stack) -> None:
    mp = stack.metrics_ports
    assert mp is not None
    ports = {"tokenizer": mp.tokenizer, "scheduler": mp.scheduler, "model": mp.model}
    ports["grammar"] = mp.grammar
    before = {svc: scrape(p) for svc, p in ports.items()}
    for svc, fams in EXPECTED.items():
        for fam, kind in fams.items():
            assert _type(before[svc], fam) == kind, (svc, fam, _type(before[svc], fam))
        assert ("process_resident_memory_bytes", ()) in before[svc]

    n_new = 6
    with Client(stack.endpoint) as c:
        plain = c.generate("The capital of France is", max_new_tokens=n_new, ignore_eos=True)
        constrained = c.generate("Answer:", regex="(yes|no)", max_new_tokens=4, temperature=0)
    assert len(plain.output_ids) == n_new
    after = {svc: scrape(p) for svc, p in ports.items()}

    def delta(svc: str, name: str, **labels: str) -> float:
        return _get(after[svc], name, **labels) - _get(before[svc], name, **labels)

    out_tokens = n_new + len(constrained.output_ids)
    assert delta("tokenizer", "radixmesh_num_requests_total") == 2
    assert delta("tokenizer", "radixmesh_request_success_total", finish_reason="length") >= 1
    assert delta("tokenizer", "radixmesh_frontdoor_generation_tokens_total") == out_tokens
    assert delta("tokenizer", "radixmesh_time_to_first_token_seconds_count") == 2
    assert delta("tokenizer", "radixmesh_e2e_request_latency_seconds_count") == 2
    assert delta("tokenizer", "radixmesh_inter_token_latency_seconds_count") >= 1
    assert _get(after["tokenizer"], "radixmesh_frontdoor_inflight_streams") == 0
    replica = stack.address("scheduler")
    assert _get(after["tokenizer"], "radixmesh_router_replica_connected", replica=replica) == 1
    routed = sum(
        delta("tokenizer", "radixmesh_router_decisions_total", replica=replica, reason=r)
        for r in ("cold", "cache_hit", "balance")
    )
    assert routed == 2  # one decision per request, each with its reason
    # The scheduler also counts a sampled stop token, which the client's output leaves out.
    sampled = out_tokens + (constrained.finish_reason == "stop")
    assert delta("scheduler", "radixmesh_generation_tokens_total") == sampled
    prompt = plain.prompt_tokens + constrained.prompt_tokens
    assert delta("scheduler", "radixmesh_prompt_tokens_total") == prompt
    assert delta("scheduler", "radixmesh_queue_time_seconds_count") == 2
    steps = delta("scheduler", "radixmesh_scheduler_step_seconds_count")
    assert steps >= n_new
    assert delta("scheduler", "radixmesh_scheduler_batch_size_count") == steps
    assert _get(after["scheduler"], "radixmesh_num_running_reqs") == 0
    assert delta("model", "radixmesh_model_forward_seconds_count") == steps
    assert delta("model", "radixmesh_model_steps_total", outcome="ok") == steps
    lookups = delta("grammar", "radixmesh_grammar_cache_hits_total") + delta(
        "grammar", "radixmesh_grammar_cache_misses_total"
    )
    assert lookups >= 1
    assert delta("grammar", "radixmesh_grammar_mask_seconds_count") >= 1


ROOT = Path(__file__).resolve().parents[2]

# The Accept headers Prometheus sends: 2.42 (OpenMetrics first), 3.x with UTF-8 names allowed
# (its default) and 3.x with legacy name validation (asks the exporter to escape names).
ACCEPT = {
    "prometheus-2": "application/openmetrics-text;version=1.0.0,"
    "application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "prometheus-3": "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    "prometheus-3-legacy": "application/openmetrics-text;version=1.0.0;escaping=underscores;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=underscores;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
}


def scrape_as(url: str, accept: str) -> tuple[str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.headers["Content-Type"], resp.read().decode()


def stored_names(text: str) -> set[str]:
    """The series names Prometheus stores from an exposition: each sample line's name as
    written (a sample's name is what is stored, whatever its HELP/TYPE lines say). Also checks
    that every sample belongs to a family its TYPE line declares under the same name, the
    mismatch a colon name and `escaping=underscores` produced."""
    declared = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    names = set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"[^{\s]+", line)
        assert m, line
        sample = m.group(0)
        base = re.sub(r"_(total|created|bucket|count|sum|info)$", "", sample)
        assert sample in declared or base in declared, (sample, "has no TYPE line")
        names.add(sample)
    return names


def queried_names() -> set[str]:
    """Every metric name the Grafana dashboard and the prometheus-adapter rule ask for."""
    dash = json.loads((ROOT / "deploy/grafana/radixmesh-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    rules = (ROOT / "deploy/k8s/monitoring/prometheus-adapter-rules.yaml").read_text()
    found = set(re.findall(r"\bradixmesh[a-zA-Z0-9_:]*", " ".join(exprs)))
    adapter = set(re.findall(r"seriesQuery: '(radixmesh[a-zA-Z0-9_:]*)", rules))
    assert len(found) >= 15 and adapter == {"radixmesh_num_queue_reqs"}, (found, adapter)
    return found | adapter


@pytest.mark.parametrize("prometheus", sorted(ACCEPT))
def test_dashboard_and_adapter_names_are_stored_as_queried(stack: Stack, prometheus: str) -> None:
    mp = stack.metrics_ports
    assert mp is not None
    with Client(stack.endpoint) as c:  # every histogram and counter the panels read has moved
        c.generate("Answer:", regex="(yes|no)", max_new_tokens=4, temperature=0)
    urls = [
        f"http://127.0.0.1:{p}/metrics" for p in (mp.tokenizer, mp.scheduler, mp.model, mp.grammar)
    ]
    stored: set[str] = set()
    for url in urls + [stack.http_url + "/metrics"]:
        content_type, text = scrape_as(url, ACCEPT[prometheus])
        assert content_type.startswith("application/openmetrics-text"), (url, content_type)
        stored |= stored_names(text)
    assert not [n for n in stored if ":" in n]
    missing = queried_names() - stored
    assert not missing, f"queried but not stored: {sorted(missing)}"


def test_http_metrics_carry_each_replicas_load_report(stack: Stack) -> None:
    """The HTTP port's /metrics (the one address a user knows) shows the replica's running and
    queued requests, hit rate and KV usage, as its load reports give them."""
    with Client(stack.endpoint) as c:
        c.generate("The capital of France is", max_new_tokens=2, ignore_eos=True)
    _, text = scrape_as(stack.http_url + "/metrics", "text/plain;version=0.0.4")
    replica = stack.address("scheduler")
    got = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("replica") == replica:
                got[s.name] = s.value
    for short in ("num_running_reqs", "num_queue_reqs", "cache_hit_rate", "token_usage"):
        assert "radixmesh_replica_" + short in got, sorted(got)
    assert 0.0 <= got["radixmesh_replica_token_usage"] <= 1.0
    assert 0.0 <= got["radixmesh_replica_cache_hit_rate"] <= 1.0
    sched = scrape(stack.metrics_ports.scheduler)  # type: ignore[union-attr]
    assert got["radixmesh_replica_num_running_reqs"] == _get(sched, "radixmesh_num_running_reqs")


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (Debian package `prometheus`): lint not run",
)
def test_promtool_lints_every_service_clean(stack: Stack) -> None:
    mp = stack.metrics_ports
    assert mp is not None
    for port in (mp.tokenizer, mp.scheduler, mp.model, mp.grammar):
        _, text = scrape_as(f"http://127.0.0.1:{port}/metrics", "text/plain;version=0.0.4")
        out = subprocess.run(
            ["promtool", "check", "metrics"], input=text, capture_output=True, text=True
        )
        assert out.returncode == 0, (port, out.stdout, out.stderr)
