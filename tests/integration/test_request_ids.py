"""One request id end to end, on a stack whose services all log JSON at debug level: the
client's X-Request-Id comes back in the response header and body, names the front door's
one info line per request, and appears on the scheduler's, model's and grammar service's
lines about that request; every line of every service's log is JSON."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from radixmesh_wire.pb import api_pb2, api_pb2_grpc
from tests.conftest import Stack, start_stack

pytestmark = pytest.mark.integration

SERVICES = ("tokenizer", "scheduler", "model", "grammar")


@pytest.fixture(scope="module")
def json_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    def json_logs(specs: dict[str, Any]) -> None:
        for spec in specs.values():
            spec.env.update(RADIXMESH_LOG_FORMAT="json", RADIXMESH_LOG_LEVEL="debug")

    yield from start_stack(tmp_path_factory.mktemp("json_logs"), before_start=json_logs)


def post(stack: Stack, path: str, body: dict[str, Any], rid: str | None) -> tuple[Any, dict]:
    headers = {"Content-Type": "application/json"}
    if rid is not None:
        headers["X-Request-Id"] = rid
    req = urllib.request.Request(
        stack.http_url + path, data=json.dumps(body).encode(), headers=headers
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.headers, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.headers, json.loads(err.read())


def log_events(stack: Stack, name: str) -> list[dict[str, Any]]:
    lines = stack.launcher.log_path(name).read_text().splitlines()
    events = []
    for n, line in enumerate(lines):
        try:
            events.append(json.loads(line))
        except ValueError:
            pytest.fail(f"{name}.log line {n + 1} is not JSON: {line[:300]!r}")
        assert isinstance(events[-1], dict), line
    return events


def test_one_request_id_through_every_service(json_stack: Stack) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
    }
    body = {
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "max_tokens": 16,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    }
    headers, out = post(json_stack, "/v1/chat/completions", body, "abc")
    assert headers["X-Request-Id"] == "abc"
    assert "id" in out, out
    assert out["id"] == "chatcmpl-abc", out
    for name in SERVICES:
        events = log_events(json_stack, name)
        mine = [e for e in events if "abc" in json.dumps(e)]
        assert mine, f"no {name} log line names request abc"
    done = [e for e in log_events(json_stack, "tokenizer") if e["event"] == "request_done"]
    line = next(e for e in done if e.get("rid") == "abc")
    assert line["level"] == "info" and line["outcome"] == "ok"
    assert line["output_tokens"] == out["usage"]["completion_tokens"]
    assert line["prompt_tokens"] == out["usage"]["prompt_tokens"]
    assert line["cached_tokens"] == out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert line["finish_reason"] == out["choices"][0]["finish_reason"]
    assert line["ttft_s"] is not None and line["total_s"] >= line["ttft_s"]


def test_sglang_rid_and_generated_ids(json_stack: Stack) -> None:
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 2}, "rid": "sg-rid-1"}
    headers, out = post(json_stack, "/generate", body, None)
    assert out["meta_info"]["id"] == "sg-rid-1"
    generated = headers["X-Request-Id"]  # none sent: the server made one and returns it
    assert len(generated) == 32
    done = [e for e in log_events(json_stack, "tokenizer") if e["event"] == "request_done"]
    assert any(e["rid"] == "sg-rid-1" for e in done)
    headers, out = post(json_stack, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, None)
    assert out["id"] == "cmpl-" + headers["X-Request-Id"]


def test_a_bad_request_id_is_refused_by_name(json_stack: Stack) -> None:
    _, out = post(json_stack, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, "a b")
    assert out["error"]["param"] == "X-Request-Id"
    _, out = post(json_stack, "/generate", {"text": "x", "rid": ["a", "b"]}, None)
    assert out["error"]["param"] == "rid"


def test_grpc_takes_the_id_from_its_field_or_metadata(json_stack: Stack) -> None:
    req = api_pb2.GenerateRequest(
        text="Hello", sampling=api_pb2.SamplingParams(max_new_tokens=1, temperature=0)
    )
    with grpc.insecure_channel(json_stack.endpoint) as chan:
        stub = api_pb2_grpc.RadixMeshStub(chan)
        call = stub.Generate(req, metadata=(("x-request-id", "grpc-md-1"),), timeout=60)
        out = list(call)
        assert ("x-request-id", "grpc-md-1") in list(call.initial_metadata())
        assert {m.request_id for m in out} == {"grpc-md-1"}
        req.request_id = "grpc-field-1"  # the field wins over the metadata
        out = list(stub.Generate(req, metadata=(("x-request-id", "other"),), timeout=60))
        assert {m.request_id for m in out} == {"grpc-field-1"}
        req.request_id = ""
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(req, metadata=(("x-request-id", "a b"),), timeout=60))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    done = [e for e in log_events(json_stack, "tokenizer") if e["event"] == "request_done"]
    assert {"grpc-md-1", "grpc-field-1"} <= {e["rid"] for e in done}
