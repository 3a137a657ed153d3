"""Bad input gets INVALID_ARGUMENT with a useful message and never disturbs other requests;
a client that disconnects mid-stream frees its KV slots."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import grpc
import pytest
from radixmesh.api import Client, GenerateResult, RadixMeshError

from radixmesh_wire.pb import api_pb2
from tests.conftest import Stack

pytestmark = pytest.mark.integration

BAD: list[tuple[dict[str, Any], str]] = [
    ({"prompt": ""}, "empty"),
    ({"prompt": "hi", "max_new_tokens": -1}, "max_new_tokens"),
    ({"prompt": "hi", "max_new_tokens": 10**6}, "context window"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "temperature": -1.0}, "temperature"),
    ({"prompt": "hi", "min_new_tokens": 9, "max_new_tokens": 3}, "min_new_tokens"),
    ({"prompt": "word " * 9000}, "context window"),
    ({"input_ids": [1, 2, 10**7]}, "vocabulary"),
    ({"messages": []}, "no messages"),
]


def test_bad_requests_rejected_while_others_run(stack: Stack) -> None:
    with Client(stack.endpoint) as c:
        result: list[GenerateResult] = []
        t = threading.Thread(
            target=lambda: result.append(
                c.generate(
                    "Count from one to ten:", max_new_tokens=24, temperature=0, ignore_eos=True
                )
            )
        )
        t.start()
        for kw, needle in BAD:
            with pytest.raises(RadixMeshError) as err:
                c.generate(**kw)
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, kw
            assert needle in err.value.message, (kw, err.value.message)
        t.join()
        assert result and result[0].completion_tokens == 24


def test_max_new_tokens_zero_only_prefills(stack: Stack) -> None:
    with Client(stack.endpoint) as c:
        res = c.generate("A prefix to cache for later.", max_new_tokens=0)
        assert res.completion_tokens == 0 and res.finish_reason == "length"
        again = c.generate("A prefix to cache for later. And more", max_new_tokens=1, temperature=0)
        assert again.cached_tokens > 0


def _wait_idle(c: Client, timeout: float = 10.0) -> api_pb2.Stats:
    """Poll GetStats until nothing runs or the deadline passes (a condition, not a sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        s = c.stats()
        if (
            s.running_requests == 0
            and s.kv_request_owned == 0
            and s.queue_length == 0
            and s.kv_locked == 0
        ) or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def test_disconnect_mid_stream_frees_slots(stack: Stack) -> None:
    with Client(stack.endpoint) as c:
        it = c.stream(
            "Tell me a very long story about dragons.",
            max_new_tokens=400,
            ignore_eos=True,
            temperature=0,
        )
        first = next(it)
        assert not isinstance(first, GenerateResult)
        busy = c.stats()
        assert busy.running_requests >= 1 and busy.kv_request_owned > 0
        it.close()  # the client goes away: gRPC cancels the call
        s = _wait_idle(c)
        assert s.running_requests == 0 and s.kv_request_owned == 0 and s.kv_locked == 0
        assert s.kv_free + s.kv_evictable == s.kv_capacity


def test_deadline_frees_slots(stack: Stack) -> None:
    with Client(stack.endpoint, timeout=0.5) as c:
        with pytest.raises(RadixMeshError) as err:
            c.generate("Write an essay.", max_new_tokens=400, ignore_eos=True)
        assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    with Client(stack.endpoint) as c:
        s = _wait_idle(c)
        assert s.running_requests == 0 and s.kv_request_owned == 0


def test_abort_rpc(stack: Stack) -> None:
    with Client(stack.endpoint) as c:
        it = c.stream(
            "Describe the sea.", max_new_tokens=400, ignore_eos=True, request_id="abort-me"
        )
        next(it)
        assert c.abort("abort-me")
        final = [x for x in it if isinstance(x, GenerateResult)][0]
        assert final.finish_reason == "abort"
        assert not c.abort("no-such-request")


def test_nonexistent_model_path_fails_cleanly() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "model_service", "--model", "/no/such/model"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr
