"""/metrics on every service of the shared stack: the Prometheus text parses, the documented
names exist with their types, and counters move by exactly what a request did."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from radixmesh.api import Client

from tests.conftest import Stack

pytestmark = pytest.mark.integration

# family name (as the parser reports it: counters without `_total`) -> type, per service
EXPECTED = {
    "tokenizer": {
        "radixmesh:frontdoor_inflight_streams": "gauge",
        "radixmesh:num_requests": "counter",
        "radixmesh:request_success": "counter",
        "radixmesh:request_failure": "counter",
        "radixmesh:frontdoor_generation_tokens": "counter",
        "radixmesh:time_to_first_token_seconds": "histogram",
        "radixmesh:inter_token_latency_seconds": "histogram",
        "radixmesh:e2e_request_latency_seconds": "histogram",
        "radixmesh:router_replica_connected": "gauge",
        "radixmesh:router_replica_load_tokens": "gauge",
        "radixmesh:router_replica_load_requests": "gauge",
    },
    "scheduler": {
        "radixmesh:num_running_reqs": "gauge",
        "radixmesh:num_queue_reqs": "gauge",
        "radixmesh:token_usage": "gauge",
        "radixmesh:cache_hit_rate": "gauge",
        "radixmesh:cache_blocks": "gauge",
        "radixmesh:prompt_tokens": "counter",
        "radixmesh:generation_tokens": "counter",
        "radixmesh:queue_time_seconds": "histogram",
        "radixmesh:scheduler_step_seconds": "histogram",
        "radixmesh:scheduler_batch_size": "histogram",
    },
    "model": {
        "radixmesh:model_forward_seconds": "histogram",
        "radixmesh:model_batch_size": "histogram",
        "radixmesh:kv_pool_tokens": "gauge",
        "radixmesh:model_steps": "counter",
    },
    "grammar": {
        "radixmesh:grammar_cache_hits": "counter",
        "radixmesh:grammar_cache_misses": "counter",
        "radixmesh:grammar_compile_seconds": "histogram",
        "radixmesh:grammar_mask_seconds": "histogram",
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
    assert delta("tokenizer", "radixmesh:num_requests_total") == 2
    assert delta("tokenizer", "radixmesh:request_success_total", finish_reason="length") >= 1
    assert delta("tokenizer", "radixmesh:frontdoor_generation_tokens_total") == out_tokens
    assert delta("tokenizer", "radixmesh:time_to_first_token_seconds_count") == 2
    assert delta("tokenizer", "radixmesh:e2e_request_latency_seconds_count") == 2
    assert delta("tokenizer", "radixmesh:inter_token_latency_seconds_count") >= 1
    assert _get(after["tokenizer"], "radixmesh:frontdoor_inflight_streams") == 0
    replica = stack.address("scheduler")
    assert _get(after["tokenizer"], "radixmesh:router_replica_connected", replica=replica) == 1
    routed = sum(
        delta("tokenizer", "radixmesh:router_decisions_total", replica=replica, reason=r)
        for r in ("cold", "cache_hit", "balance")
    )
    assert routed == 2  # one decision per request, each with its reason
    # The scheduler also counts a sampled stop token, which the client's output leaves out.
    sampled = out_tokens + (constrained.finish_reason == "stop")
    assert delta("scheduler", "radixmesh:generation_tokens_total") == sampled
    prompt = plain.prompt_tokens + constrained.prompt_tokens
    assert delta("scheduler", "radixmesh:prompt_tokens_total") == prompt
    assert delta("scheduler", "radixmesh:queue_time_seconds_count") == 2
    steps = delta("scheduler", "radixmesh:scheduler_step_seconds_count")
    assert steps >= n_new
    assert delta("scheduler", "radixmesh:scheduler_batch_size_count") == steps
    assert _get(after["scheduler"], "radixmesh:num_running_reqs") == 0
    assert delta("model", "radixmesh:model_forward_seconds_count") == steps
    assert delta("model", "radixmesh:model_steps_total", outcome="ok") == steps
    lookups = delta("grammar", "radixmesh:grammar_cache_hits_total") + delta(
        "grammar", "radixmesh:grammar_cache_misses_total"
    )
    assert lookups >= 1
    assert delta("grammar", "radixmesh:grammar_mask_seconds_count") >= 1
