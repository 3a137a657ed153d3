"""Metrics building blocks without a stack: the scrape-time collector, the front door's
per-call timer invariants, and JSON logs carrying the request id."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.metrics import Reading, StatsCollector, new_registry
from tokenizer_service.metrics import FrontDoorMetrics


def _families(registry) -> dict:  # type: ignore[no-untyped-def]
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_stats_collector_reads_live_values_with_labels() -> None:
    reg = new_registry()
    box = {"n": 3}
    reg.register(
        StatsCollector(
            lambda: [
                Reading("widgets", "counter", "w", box["n"], (("kind", "a"),)),
                Reading("widgets", "counter", "w", 1, (("kind", "b"),)),
                Reading("level", "gauge", "l", 0.5),
            ]
        )
    )
    box["n"] = 7  # read at scrape time, not at registration
    fams = _families(reg)
    w = fams["radixmesh_widgets"]
    assert w.type == "counter"
    got = {(s.name, s.labels["kind"]): s.value for s in w.samples if s.name.endswith("_total")}
    assert got == {("radixmesh_widgets_total", "a"): 7.0, ("radixmesh_widgets_total", "b"): 1.0}
    assert fams["radixmesh_level"].type == "gauge"


def test_request_timer_counts_each_call_once() -> None:
    m = FrontDoorMetrics()
    ok, cancelled, bad = m.start(), m.start(), m.start()
    assert m.inflight._value.get() == 3
    ok.tokens(1)
    ok.tokens(2)
    ok.succeeded("length", prompt_tokens=4, output_tokens=3)
    # Out of flight at its outcome, before the handler's finally: a client that has its answer
    # and scrapes at once sees its stream closed (the CI race of test_metrics).
    assert m.inflight._value.get() == 2
    bad.failed("invalid_argument")
    assert m.inflight._value.get() == 1
    for t in (ok, cancelled, bad, ok):  # close twice: still one decrement
        t.close()
    fams = _families(m.registry)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples
    }
    assert samples[("radixmesh_frontdoor_inflight_streams", ())] == 0
    assert samples[("radixmesh_request_success_total", (("finish_reason", "length"),))] == 1
    fail = "radixmesh_request_failure_total"
    assert samples[(fail, (("reason", "cancelled"),))] == 1
    assert samples[(fail, (("reason", "invalid_argument"),))] == 1
    assert samples[("radixmesh_time_to_first_token_seconds_count", ())] == 1
    # one sample per token after the first event: its second event brought 2
    assert samples[("radixmesh_inter_token_latency_seconds_count", ())] == 2
    assert samples[("radixmesh_frontdoor_generation_tokens_total", ())] == 3


@pytest.mark.integration  # starts a process
def test_json_logs_carry_service_and_request_id() -> None:
    code = (
        "import structlog\n"
        "from services.logging import configure_logging\n"
        "configure_logging('tokenizer', 'info', json=True)\n"
        "structlog.contextvars.bind_contextvars(rid='r-42')\n"
        "structlog.get_logger().info('submitted', prompt_tokens=3)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    line = json.loads(out.stderr.strip().splitlines()[-1])
    assert line["event"] == "submitted" and line["rid"] == "r-42"
    assert line["service"] == "tokenizer" and line["level"] == "info"
    assert line["prompt_tokens"] == 3 and "timestamp" in line


def test_the_hold_is_one_sample_per_event_of_its_oldest_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`frontdoor_token_hold_seconds`: per event, how long its oldest token waited in the front
    door (RequestTimer.tokens' `oldest`); an event without one (0) adds nothing."""
    from tokenizer_service import metrics as metrics_mod

    now = iter([10.0, 10.05, 10.2, 10.3])
    fake_time = SimpleNamespace(perf_counter=lambda: next(now))
    monkeypatch.setattr(metrics_mod, "time", fake_time)  # this module's clock only
    m = FrontDoorMetrics()
    t = m.start()  # t0 = 10.0
    t.tokens(1, oldest=10.04)  # the first event: its token waited 10 ms
    t.tokens(3, oldest=10.14)  # three tokens, the oldest 60 ms old
    t.tokens(1)  # unknown arrival: no hold sample
    fams = _families(m.registry)
    got = {
        s.labels.get("le", s.name): s.value
        for s in fams["radixmesh_frontdoor_token_hold_seconds"].samples
    }
    assert got["radixmesh_frontdoor_token_hold_seconds_count"] == 2
    assert got["radixmesh_frontdoor_token_hold_seconds_sum"] == pytest.approx(0.07)


def test_inter_token_latency_counts_each_token_of_an_event() -> None:
    """An event of n tokens after a gap g is n samples of g / n (SGLang's counting), recorded
    with one bucket lookup; the exposition is a Prometheus histogram with the usual series."""
    m = FrontDoorMetrics()
    m.itl.observe(0.003, 3)  # 3 tokens, 1 ms apart
    m.itl.observe(0.02, 1)  # 1 token after 20 ms
    m.itl.observe(0.0011, 1)  # just above the 1 ms bound
    fams = _families(m.registry)
    f = fams["radixmesh_inter_token_latency_seconds"]
    assert f.type == "histogram"
    got = {s.labels.get("le", s.name): s.value for s in f.samples}
    assert got["radixmesh_inter_token_latency_seconds_count"] == 5
    assert got["radixmesh_inter_token_latency_seconds_sum"] == pytest.approx(0.0241)
    assert got["0.001"] == 3  # le is inclusive: the three 1 ms gaps
    assert got["0.0025"] == 4 and got["+Inf"] == 5
    buckets = [v for k, v in got.items() if not k.startswith("radixmesh")]
    assert buckets == sorted(buckets)  # cumulative
