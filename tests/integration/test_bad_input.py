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

from radixmesh_wire.packing import pack_i32, unpack_i32
from radixmesh_wire.pb import api_pb2, model_pb2, scheduler_pb2
from tests.conftest import LoneModel, Stack
from tests.integration.raw_peers import ModelSession, SchedulerSession, channel_as

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


# -- internal peers: the scheduler and the model worker check what they receive themselves --


def _submit(
    key: int, ids: list[int], rid: str = "", **sampling: object
) -> scheduler_pb2.SubmitRequest:
    s = api_pb2.SamplingParams(max_new_tokens=4, temperature=0.0)
    for k, v in sampling.items():
        if isinstance(v, list):
            getattr(s, k).extend(v)
        else:
            setattr(s, k, v)
    return scheduler_pb2.SubmitRequest(
        rid=rid or f"raw-{key}", input_ids=ids, sampling=s, eos_token_ids=[2], key=key
    )


def test_scheduler_refuses_bad_submissions_alone(stack: Stack) -> None:
    """An empty prompt once killed the scheduler loop for good; an id of 10**6 failed every
    request of the step. Each is refused alone; the loop and a concurrent request go on."""
    with Client(stack.endpoint) as c:
        result: list[GenerateResult] = []
        t = threading.Thread(
            target=lambda: result.append(
                c.generate(
                    "Count from one to ten:", max_new_tokens=16, temperature=0, ignore_eos=True
                )
            )
        )
        t.start()
        sess = SchedulerSession(channel_as(stack.launcher, "scheduler", "tokenizer"))
        try:
            ctx = sess.hello.context_length
            bad = [
                (_submit(1, []), "input_ids is empty"),
                (_submit(2, [1, 1_000_000]), "outside the vocabulary"),
                (
                    _submit(3, [1, 2], stop_token_ids=[1_000_000], min_new_tokens=2),
                    "stop_token_ids",
                ),
                (_submit(4, [1] * (ctx + 1), max_new_tokens=0), "context window"),
                (_submit(5, [1, 2], temperature=float("inf")), "temperature"),
                (_submit(6, [1, 2], top_p=float("nan")), "top_p"),
            ]
            for msg, _ in bad:
                sess.submit(msg)
            sess.submit(_submit(7, [1, 2, 3], ignore_eos=True))
            for msg, needle in bad:
                out = sess.wait(msg.key)
                assert out.error_code == grpc.StatusCode.INVALID_ARGUMENT, (msg.key, out)
                assert needle in out.error_message, (msg.key, out.error_message)
            ok = sess.wait(7)
            assert ok.error_code is None and len(ok.tokens) == 4
        finally:
            sess.close()
        t.join()
        assert result and result[0].completion_tokens == 16


def test_duplicate_request_id_keeps_first_abortable(stack: Stack) -> None:
    with Client(stack.endpoint) as c:
        it = c.stream("Describe the sea.", max_new_tokens=400, ignore_eos=True, request_id="dup-1")
        next(it)
        with pytest.raises(RadixMeshError) as err:
            c.generate("hi", max_new_tokens=2, request_id="dup-1")
        assert err.value.code == grpc.StatusCode.ALREADY_EXISTS and "dup-1" in err.value.message
        assert c.abort("dup-1")
        final = [x for x in it if isinstance(x, GenerateResult)][0]
        assert final.finish_reason == "abort"


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _admit_step(step_id: int, handle: int, ids: list[int], first_slot: int) -> model_pb2.Step:
    return model_pb2.Step(
        step_id=step_id,
        admits=[
            model_pb2.Admit(
                handle=handle,
                sampling=model_pb2.RequestSampling(temperature=0, top_p=1, prompt_logprobs_from=-1),
                input_ids=pack_i32(ids),
                slots=pack_i32(range(first_slot, first_slot + len(ids))),
                sample=True,
            )
        ],
    )


def test_model_refuses_bad_steps_and_bounds_mask_wait(lone_model: LoneModel) -> None:
    sess = ModelSession(grpc.insecure_channel(lone_model.address))
    try:
        sess.step(_admit_step(1, 0, [1, 2, 3], 0))
        ok = sess.result()
        assert not ok.error and unpack_i32(ok.handles) == [0]
        rss0 = _rss_kb(lone_model.pid)
        for i in range(10):  # a huge handle once grew the handle table by ~150 MB
            sess.step(_admit_step(2 + i, 10_000_000 + i, [1, 2], 100))
            res = sess.result()
            assert "admitted handle 1000000" in res.error, res.error
        assert _rss_kb(lone_model.pid) - rss0 < 20_000
        sess.step(_admit_step(20, 1, [1, 1_000_000], 100))
        assert "token id 1000000" in sess.result().error
        # Masks promised and never sent: the step fails after --mask-wait-s (1 s), not 60 s.
        t0 = time.monotonic()
        sess.step(
            model_pb2.Step(
                step_id=21,
                decode_handles=pack_i32([0]),
                decode_slots=pack_i32([3]),
                masks_follow=True,
            )
        )
        res = sess.result()
        assert "did not come in 1.0 s" in res.error  # the configured wait ended it, not 60 s
        print(f"masks never sent: the step failed after {time.monotonic() - t0:.1f} s")
        sess.masks(model_pb2.StepMasks(step_id=21))  # too late: dropped
        sess.masks(model_pb2.StepMasks(step_id=999))  # never expected: dropped
        sess.step(
            model_pb2.Step(step_id=22, decode_handles=pack_i32([0]), decode_slots=pack_i32([4]))
        )
        res = sess.result()
        assert not res.error and unpack_i32(res.handles) == [0]
    finally:
        sess.close()


CONSTRAINED_ENDS = [
    ({"regex": "[0-9]{2}", "min_new_tokens": 5}, 2),
    ({"regex": "[0-9]{2}", "ignore_eos": True}, 2),
    ({"regex": "[0-9]{2}", "ignore_eos": True, "min_new_tokens": 4, "temperature": 1.0}, 2),
    ({"regex": "", "min_new_tokens": 1}, 0),
]


@pytest.mark.parametrize(("kw", "chars"), CONSTRAINED_ENDS)
def test_grammar_end_wins_over_min_new_tokens_and_ignore_eos(
    stack: Stack, kw: dict[str, object], chars: int
) -> None:
    """These once answered INTERNAL ("token 0 rejected by the grammar"): the grammar allowed
    only EOS and min_new_tokens / ignore_eos banned it. The grammar's end wins."""
    with Client(stack.endpoint) as c:
        res = c.generate("The answer is", **{"max_new_tokens": 8, "temperature": 0, **kw})  # type: ignore[arg-type]
        assert res.finish_reason == "stop", res
        assert len(res.text) == chars and res.text.isdigit() == (chars > 0), res.text


def test_non_finite_temperature_is_refused(stack: Stack) -> None:
    with Client(stack.endpoint) as c:
        with pytest.raises(RadixMeshError) as err:
            c.generate("hi", json_schema='{"type": "integer"}', temperature=float("inf"))
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "temperature" in err.value.message
